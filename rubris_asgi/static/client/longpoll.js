// The HTTP long-poll transport (§7): a POST opens the session, GETs poll for numbered frames
// (acknowledged by the next poll), POSTs carry client frames one at a time and in order. Same
// interface as WebSocketConnection (see websocket.js); it retries a lost poll or POST itself
// with the same ack, as its contract asks, and leaves every other decision to the client.

import { ErrorCode, Kind, decodeFrame, joinFrames } from "./codec.js";
import { backoffDelay, now, sleep } from "./util.js";

/** How long a poll may hang before we assume an intermediary ate it (server default wait: 25 s). */
const LP_POLL_ABORT_MS = 60_000;
/** How long the first POST (HELLO → WELCOME) may take. */
const LP_OPEN_TIMEOUT_MS = 20_000;
/** How long a client frame POST may take before it is retried. */
const LP_POST_TIMEOUT_MS = 20_000;
/** Give up retrying a poll or POST after this long: the server drops the session at 30 s anyway. */
const LP_GIVE_UP_MS = 25_000;

export class LongPollConnection {
  constructor(client, urls) {
    this.client = client;
    this.urls = urls;
    this.kind = "longpoll";
    this.session = null;
    this.ack = 0;
    this.dead = false;
    this.queue = []; // {bytes, count}: frames waiting for the POST in flight to finish
    this.queued = 0; // messages in `queue`
    this.posting = false;
    this.controllers = new Set();
    this.handover = null; // called instead of the next poll once nothing is in flight
  }

  /** Stop at the next point with no poll waiting and no POST in flight or queued; call `fn`. */
  handOver(fn) {
    this.handover = fn;
  }

  get backlog() {
    return this.queued;
  }

  async _fetch(url, init, timeoutMs) {
    const controller = new AbortController();
    this.controllers.add(controller);
    const timer = setTimeout(() => controller.abort(), timeoutMs);
    try {
      return await this.client._opts.fetch(url, { ...init, signal: controller.signal });
    } finally {
      clearTimeout(timer);
      this.controllers.delete(controller);
    }
  }

  _sessionUrl(extra = "") {
    const q = [extra, this.urls.query].filter(Boolean).join("&");
    return this.urls.lpSession(this.session) + (q ? `?${q}` : "");
  }

  async start(hello) {
    let res;
    let body;
    try {
      res = await this._fetch(this.urls.lpOpen, {
        method: "POST",
        body: hello,
        headers: { "Content-Type": "application/octet-stream" },
        cache: "no-store",
      }, LP_OPEN_TIMEOUT_MS);
      if (this.dead) return;
      if (res.status === 404 || res.status === 405) {
        // a rubris mount answers POST /lp: nothing is routed here
        this._lost({ fatal: true, code: ErrorCode.NOT_AUTHORISED, status: res.status, reason: noEndpoint(this.urls.lpOpen, res.status) });
        return;
      }
      if (res.status !== 200) {
        const text = await reasonOf(res);
        if (this.dead) return;
        this._lost(httpFailure(res.status, "long-poll open", text, this.urls.lpOpen));
        return;
      }
      body = new Uint8Array(await res.arrayBuffer());
    } catch (err) {
      this._lost({ reason: `long-poll open failed: ${err.message}` });
      return;
    }
    if (this.dead) return;
    // The session id is inside WELCOME (§7); read it here so polling can start. The client
    // parses the same messages again through the ordinary path.
    let messages;
    try {
      messages = decodeFrame(body);
    } catch (err) {
      this.client._protocolError(this, err.message);
      return;
    }
    const first = messages[0];
    if (first && first.kind === Kind.WELCOME) this.session = first.session;
    this.client._onFrame(this, body, messages);
    if (this.dead || this.session === null) return;
    this._poll();
    this._pump();
  }

  async _poll() {
    let failingSince = 0;
    let attempt = 0;
    const retry = async (reason) => {
      // The same ack again: the server re-sends frame ack+1, so a lost response loses nothing.
      if (!failingSince) {
        failingSince = now();
        this.client._onConnStalled(this, true);
      }
      if (now() - failingSince > LP_GIVE_UP_MS) {
        this._lost({ reason: `long-poll unreachable: ${reason}` });
        return false;
      }
      await sleep(backoffDelay(attempt++));
      return !this.dead;
    };
    while (!this.dead) {
      if (this.handover) {
        await sleep(0); // what the frame just handled made the client write goes out first
        if (this.dead) return;
        if (this.handover && !this.posting && !this.queue.length) {
          const fn = this.handover;
          this.handover = null;
          fn();
          return;
        }
      }
      let res;
      let body = null;
      try {
        res = await this._fetch(this._sessionUrl(`ack=${this.ack}`), {
          method: "GET",
          cache: "no-store",
        }, LP_POLL_ABORT_MS);
        if (res.status === 200) body = new Uint8Array(await res.arrayBuffer());
      } catch (err) {
        if (this.dead || !(await retry(err.message))) return;
        continue;
      }
      if (this.dead) return;
      if (res.status >= 500 || res.status === 429) {
        if (!(await retry(`HTTP ${res.status}`))) return;
        continue;
      }
      if (res.status !== 200 && res.status !== 204) {
        // Before un-stalling: a 404 after an outage (a restarted server) is not "open again".
        const text = res.status === 401 || res.status === 403 ? await reasonOf(res) : "";
        if (this.dead) return;
        this._lost(httpFailure(res.status, "long-poll", text, this._sessionUrl()));
        return;
      }
      if (failingSince) {
        failingSince = 0;
        attempt = 0;
        this.client._onConnStalled(this, false);
      }
      if (res.status === 204) continue; // the poll timed out with nothing to send: poll again
      const number = Number(res.headers.get("Rubris-Frame"));
      if (!Number.isSafeInteger(number) || number < 1) {
        this.client._protocolError(this, "long-poll response without a valid Rubris-Frame header");
        return;
      }
      if (number <= this.ack) continue; // a frame we already have, re-sent after a lost response
      this.ack = number;
      if (body.length) this.client._onFrame(this, body);
    }
  }

  send(frame, count = 1) {
    if (this.dead) return;
    this.queue.push({ bytes: frame, count });
    this.queued += count;
    this._pump();
  }

  /** For page unload: a keepalive POST outlives the page; ordering does not matter for ACKs. */
  sendUrgent(frame) {
    if (this.dead || this.session === null) return;
    this.client._opts.fetch(this._sessionUrl(), {
      method: "POST",
      body: frame,
      headers: { "Content-Type": "application/octet-stream" },
      keepalive: true,
    }).catch(() => {});
  }

  /**
   * One POST at a time, so that client messages reach the server in the order they were sent
   * (a SUBSCRIBE before its UNSUBSCRIBE); whatever queued meanwhile goes in the next POST.
   */
  async _pump() {
    if (this.posting || this.dead || this.session === null) return;
    this.posting = true;
    try {
      while (!this.dead && this.queue.length) {
        const max = this.client._maxFrame;
        // Frames are message sequences, so frames back to back are one valid frame (§2).
        const first = this.queue.shift();
        const parts = [first.bytes];
        let size = first.bytes.length;
        while (this.queue.length && size + this.queue[0].bytes.length <= max) {
          size += this.queue[0].bytes.length;
          parts.push(this.queue.shift().bytes);
        }
        const body = joinFrames(parts);
        let failingSince = 0;
        let attempt = 0;
        for (;;) {
          let res;
          try {
            res = await this._fetch(this._sessionUrl(), {
              method: "POST",
              body,
              headers: { "Content-Type": "application/octet-stream" },
              cache: "no-store",
            }, LP_POST_TIMEOUT_MS);
          } catch (err) {
            res = { status: 0, error: err };
          }
          if (this.dead) return;
          if (res.status >= 200 && res.status < 300) break;
          if (res.status === 0 || res.status >= 500 || res.status === 429) {
            // Retried as is: the protocol has no client frame numbers, so a POST whose 202 was
            // lost may arrive twice. Network errors almost always mean it never arrived.
            failingSince ||= now();
            if (now() - failingSince > LP_GIVE_UP_MS) {
              this._lost({ reason: `long-poll POST failed: ${res.error?.message ?? `HTTP ${res.status}`}` });
              return;
            }
            await sleep(backoffDelay(attempt++));
            if (this.dead) return;
            continue;
          }
          this._lost(httpFailure(res.status, "long-poll POST"));
          return;
        }
        this.queued = this.queue.reduce((n, f) => n + f.count, 0);
      }
      this.queued = 0;
    } finally {
      this.posting = false;
    }
  }

  close() {
    if (this.dead) return;
    this.dead = true;
    for (const c of this.controllers) c.abort();
    this.controllers.clear();
    this.queue = [];
    this.queued = 0;
  }

  _lost(info) {
    if (this.dead) return;
    this.close();
    this.client._onConnLost(this, info);
  }
}

/** What an HTTP status means to the client (§7). */
export function httpFailure(status, what, text = "", url = "") {
  switch (status) {
    case 401:
    case 403:
      // rubris's refusals (origin, credentials) say why; a bare one is a path with no rubris
      if (!text) return { fatal: true, code: ErrorCode.NOT_AUTHORISED, status, reason: noEndpoint(url, status) };
      return { fatal: true, code: ErrorCode.NOT_AUTHORISED, status, reason: `${what}: refused (HTTP ${status}): ${text}` };
    case 404:
      return { ended: true, status, reason: `${what}: session ended (HTTP 404)` };
    case 409:
      return { superseded: true, status, reason: `${what}: superseded by another poll (HTTP 409)` };
    case 400:
      return { protocol: true, status, reason: `${what}: server refused the frame as malformed (HTTP 400)` };
    case 413:
      return { protocol: true, status, reason: `${what}: frame too large (HTTP 413)` };
    default:
      return { status, reason: `${what}: HTTP ${status}${text ? `: ${text}` : ""}` };
  }
}

/** Why a bare 403/404/405 means a wrong URL: what a path with no rubris behind it answers. */
export function noEndpoint(url, status) {
  return `no rubris endpoint at ${url} (HTTP ${status} with no reason): is the mount path right?`;
}

/** The first 300 characters of a refusal's body: rubris's refusals carry their reason. */
async function reasonOf(res) {
  try {
    return (await res.text()).slice(0, 300).trim();
  } catch {
    return "";
  }
}
