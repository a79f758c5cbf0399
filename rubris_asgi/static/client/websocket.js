// The WebSocket transport: one connection of the client, binary frames both ways, subprotocol
// rubris.v1. Long-poll (longpoll.js) stands in for it where WebSockets do not get through; the
// two share the small interface described below, which is all the client sees of a transport.
//
// Both have the same shape: start(helloFrame), send(frame), sendUrgent(frame), close(), backlog,
// kind. They report to the client through _onFrame(conn, bytes), _onConnLost(conn, info) and
// (long-poll only) _onConnStalled(conn, stalled). A transport never reconnects by itself beyond
// what its own contract asks (long-poll retries a lost poll with the same ack, §7); deciding
// what comes next is the client's job.

import { SUBPROTOCOL } from "./codec.js";

/** Close codes that refuse the connection itself: protocol error, policy, unsupported data. */
const REFUSALS = new Set([1002, 1003, 1007, 1008, 1009, 1010]);

const CLOSE_REASON_BYTES = 123; // RFC 6455: the close frame's reason is at most 123 UTF-8 bytes

/** `reason` cut at a character boundary so that its UTF-8 form fits a close frame. */
export function closeReason(reason) {
  let bytes = 0;
  let end = 0;
  for (const ch of reason) {
    const cp = ch.codePointAt(0);
    bytes += cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
    if (bytes > CLOSE_REASON_BYTES) break;
    end += ch.length;
  }
  return reason.slice(0, end);
}

export class WebSocketConnection {
  constructor(client, url) {
    this.client = client;
    this.url = url;
    this.kind = "websocket";
    this.ws = null;
    this.dead = false;
  }

  start(hello) {
    let ws;
    try {
      ws = new this.client._opts.WebSocket(this.url, SUBPROTOCOL);
    } catch (err) {
      // e.g. a blocked port or a bad URL: report asynchronously, like a failed connection.
      queueMicrotask(() => this._lost({ reason: `cannot open WebSocket: ${err.message}` }));
      return;
    }
    this.ws = ws;
    ws.binaryType = "arraybuffer";
    ws.onopen = () => {
      if (!this.dead) ws.send(hello);
    };
    ws.onmessage = (ev) => {
      if (this.dead) return;
      if (typeof ev.data === "string") {
        this.client._protocolError(this, "text WebSocket message (rubris is binary only)");
        return;
      }
      this.client._onFrame(this, new Uint8Array(ev.data));
    };
    // An error is always followed by close, which carries the code; nothing to do here.
    ws.onerror = () => {};
    ws.onclose = (ev) => {
      const reason = ev.reason || `WebSocket closed (${ev.code})`;
      // Closed by policy before WELCOME: the server refused this connection (origin,
      // credentials) where it could not answer the handshake with a status. 1012 and 1013 are
      // "not now" (a node starting or stopping): the client tries again.
      const welcomed = this.client._conn === this && this.client._welcomed;
      const refused = !welcomed && (REFUSALS.has(ev.code) || (ev.code >= 4000 && ev.code < 5000));
      if (refused) this._lost({ fatal: true, closeCode: ev.code, reason: `${this.url} refused the connection: ${reason}` });
      else this._lost({ closeCode: ev.code, reason });
    };
  }

  get backlog() {
    return this.ws ? this.ws.bufferedAmount : 0;
  }

  send(frame) {
    if (!this.dead && this.ws && this.ws.readyState === 1) this.ws.send(frame);
  }

  sendUrgent(frame) {
    this.send(frame);
  }

  close(code = 1000, reason = "") {
    if (this.dead) return;
    this.dead = true;
    const ws = this.ws;
    if (!ws) return;
    ws.onopen = ws.onmessage = ws.onclose = null;
    try {
      ws.close(code, closeReason(reason));
    } catch {
      // already closing
    }
  }

  _lost(info) {
    if (this.dead) return;
    this.close();
    this.client._onConnLost(this, info);
  }
}
