// The session: opening a connection on the chosen transport, WELCOME, a new or resumed session,
// drops and reconnects with backoff, the fall-back to long-poll and the way back to WebSocket,
// heartbeats and PING, the frame dispatch to the other concerns, page hooks, and the final
// shutdown. Methods of RubrisClient (installed by rubris-client.js).

import { ErrorCode, Kind, Mode, SUBPROTOCOL, decodeFrame, encode, joinFrames } from "./codec.js";
import { LongPollConnection } from "./longpoll.js";
import { backoffDelay, now } from "./util.js";
import { RubrisError } from "./values.js";
import { WebSocketConnection } from "./websocket.js";

/** Two WebSocket drops without a byte of data within this window mean "something kills them". */
const BAD_DROP_WINDOW_MS = 30_000;
/** A connection that lived this long resets the backoff. */
const STABLE_MS = 10_000;
/** Backoff of the WebSocket probes while long-poll stands in for a WebSocket that had worked. */
const UPGRADE_BASE_MS = 1000;
const UPGRADE_MAX_MS = 60_000;
export const DEFAULT_MAX_FRAME = 1 << 20;

export const sessionMethods = {
  // ----- connection lifecycle ----------------------------------------------------------------

  _chooseTransport() {
    if (this._opts.transport !== "auto") return this._opts.transport;
    return this._fallback || this._tryLongPoll ? "longpoll" : "websocket";
  },

  _connect() {
    this._reconnectTimer = null;
    if (this.state === "closed") return;
    const kind = this._chooseTransport();
    const conn = kind === "websocket"
      ? new WebSocketConnection(this, this._urls.ws)
      : new LongPollConnection(this, this._urls);
    conn.framesAfterWelcome = 0;
    this._conn = conn;
    this._welcomed = false;
    this.transport = kind;
    if (kind === "websocket") {
      // Counted to WELCOME, not to `open`: a proxy may complete the upgrade and pass nothing.
      conn.openTimer = setTimeout(() => {
        if (this._conn === conn && !this._welcomed) {
          this._dropConn(conn, { reason: `no WELCOME within ${this._opts.wsOpenTimeoutMs} ms` });
        }
      }, this._opts.wsOpenTimeoutMs);
    }
    conn.start(this._helloFrame());
  },

  /**
   * HELLO, and when it resumes, a SUBSCRIBE per ring and keyed topic held, in the same frame (§5
   * "Resume is exact", §5b): a resumed session's rings and tables go on from what this client
   * holds (its epoch and last seq), not from what the server wrote to the lost connection. The
   * server answers each with SUBSCRIBED (`recovered`) and replays, a ring a GAP first for what it
   * lost, a table the keys changed since (or RESET and the whole of it), before anything newer.
   * In HELLO's frame because the server holds them back only until that frame is handled. If
   * the server starts a new session instead, these are its re-subscriptions (_newSession keeps
   * them). Snapshot, private and queue topics are not restated: the server keeps their state
   * itself.
   */
  _helloFrame() {
    for (const [req, wire] of this._restating) {
      // An earlier attempt's, never answered on a live connection.
      if (this._byReq.get(req) === wire) this._byReq.delete(req);
      wire.reqs.delete(req);
    }
    this._restating.clear();
    const hello = encode.hello(this._resume);
    if (this._resume === "") return hello;
    const parts = [hello];
    for (const wire of this._wires.values()) {
      if (wire.state !== "active" || wire.epoch === null) continue;
      if (wire.mode !== Mode.RING && wire.mode !== Mode.KEYED) continue;
      const req = this._nextReq++;
      wire.reqs.add(req);
      this._byReq.set(req, wire);
      this._restating.set(req, wire);
      parts.push(encode.subscribe(req, wire.name, wire.epoch, wire.lastSeq, wire.wireParams, wire.wireCompressed));
    }
    return joinFrames(parts);
  },

  _dropConn(conn, info) {
    conn.close(info.protocol ? 4001 : 1000, info.reason ?? "");
    this._onConnLost(conn, info);
  },

  _protocolError(conn, message) {
    if (conn !== this._conn) return;
    this._emit("error", { code: ErrorCode.PROTOCOL, message: `protocol error: ${message}` });
    this._dropConn(conn, { protocol: true, reason: message });
  },

  _onConnStalled(conn, stalled) {
    if (conn !== this._conn || !this._welcomed) return;
    this._setState(stalled ? "reconnecting" : "open");
  },

  _onConnLost(conn, info) {
    if (conn !== this._conn) return;
    this._cancelUpgrade();
    clearTimeout(conn.openTimer);
    clearInterval(this._hbTimer);
    this._hbTimer = null;
    const wasWelcomed = this._welcomed;
    this._conn = null;
    this._welcomed = false;
    // The server takes every outstanding queue item back when a connection is lost (§5).
    this._resetQueues();
    if (this.state === "closed") return;
    if (info.protocol && info.status) {
      this._emit("error", { code: ErrorCode.PROTOCOL, message: info.reason });
    }
    if (info.fatal) {
      this._shutdown(new RubrisError(info.reason, info.code ?? ErrorCode.NOT_AUTHORISED));
      return;
    }
    if (!this._opts.reconnect) {
      this._shutdown(new RubrisError(`connection lost: ${info.reason}`, ErrorCode.CLOSED));
      return;
    }

    let delay;
    const auto = this._opts.transport === "auto";
    if (auto && conn.kind === "websocket" && !info.goodbye) {
      if (!wasWelcomed) {
        // Never got through: try long-poll at once.
        this._tryLongPoll = true;
        delay = 0;
      } else if (conn.framesAfterWelcome === 0) {
        // Upgraded, welcomed, then cut before a single frame of data: twice in a short while
        // looks like a proxy that kills WebSockets.
        const t = now();
        this._badDrops = this._badDrops.filter((at) => t - at < BAD_DROP_WINDOW_MS);
        this._badDrops.push(t);
        if (this._badDrops.length >= 2) {
          this._tryLongPoll = true;
          this._badDrops = [];
          this._wsWorked = false; // handshakes get through, the connections do not: stay off
          delay = 0;
        }
      }
    } else if (auto && conn.kind === "longpoll" && !wasWelcomed && !this._fallback) {
      // Long-poll failed too, so the server is probably down: go back to trying WebSocket first.
      this._tryLongPoll = false;
    }
    if (info.superseded) {
      // Someone else polls this session. Resuming it would take it back and start a tug of war;
      // a fresh session leaves the other poller alone.
      this._resume = "";
    }
    if (wasWelcomed && now() - conn.welcomedAt > STABLE_MS) {
      this._attempt = 0;
      if (conn.kind === "websocket") this._upgradeAttempt = 0;
    }
    if (delay === undefined) {
      const slow = info.goodbye && (info.goodbye.code === 9 || info.goodbye.code === 7);
      // 1013 try again later, 1012 service restart (uvicorn closes with it on shutdown, before
      // the app could say GOODBYE): give the server a second before knocking again.
      if (slow || info.closeCode === 1013 || info.closeCode === 1012) this._attempt = Math.max(this._attempt, 2);
      delay = backoffDelay(this._attempt++, 250, this._opts.backoffMaxMs);
    }
    this._setState(this._everOpen ? "reconnecting" : "connecting");
    this._reconnectTimer = setTimeout(() => this._connect(), delay);
  },

  _onWelcome(conn, w) {
    clearTimeout(conn.openTimer);
    conn.welcomedAt = now();
    // resumed=1 only means something if we asked to resume.
    const resumed = w.resumed === 1 && this._resume !== "" && this._sessionGen > 0;
    this._welcomed = true;
    this._everOpen = true;
    this._resume = w.resume;
    this.sessionId = w.session;
    this._heartbeatMs = w.heartbeatMs;
    this._maxFrame = w.maxFrame > 0 ? w.maxFrame : DEFAULT_MAX_FRAME;
    this.resumed = resumed;
    // Long-poll got through where a WebSocket did not. If WebSockets never worked here, they are
    // blocked: stay on long-poll. If they did, the server was more likely down (restarting) when
    // the WebSocket failed and back up a moment later: long-poll carries the session for now, and
    // _scheduleUpgrade takes it back to a WebSocket once one opens again.
    if (conn.kind === "longpoll" && this._tryLongPoll && !this._wsWorked) this._fallback = true;
    this._tryLongPoll = false;
    if (resumed) this._resumeSession();
    else this._newSession();
    this._setState("open", true);
    if (this._conn !== conn) return; // a "state" listener closed the client

    // Everything the server does not know about yet, in one batch: SUBSCRIBEs first, then what
    // the app sent while we were away (calls, unsubscribes of a resumed session).
    for (const wire of this._wires.values()) {
      if (wire.state === "unsent") this._sendSubscribe(wire);
    }
    const waiting = this._outbox;
    this._outbox = [];
    for (const entry of waiting) this._write(entry);
    if (resumed) this._flushAcks(false);
    // one PING at once, so the round-trip time is known from the start (stats.rttMs)
    this._sendPing();

    if (conn.kind === "websocket" && this._heartbeatMs > 0) {
      this._lastRx = now();
      const tick = Math.max(50, Math.floor(this._heartbeatMs / 2));
      this._hbTimer = setInterval(() => this._heartbeat(conn), tick);
    }
    if (conn.kind === "longpoll" && this._opts.transport === "auto" && !this._fallback) {
      this._scheduleUpgrade(conn);
    }
  },

  // ----- back from long-poll to WebSocket (auto) ---------------------------------------------

  /**
   * Long-poll stands in for a WebSocket that failed after WebSockets had worked. Now and then
   * (backing off to a minute) open a bare WebSocket, without HELLO, to see whether they get
   * through again; when one opens, the session moves to a WebSocket connection by a resume.
   */
  _scheduleUpgrade(conn) {
    clearTimeout(this._upgradeTimer);
    const delay = backoffDelay(this._upgradeAttempt++, UPGRADE_BASE_MS, UPGRADE_MAX_MS);
    this._upgradeTimer = setTimeout(() => this._probeWebSocket(conn), delay);
  },

  _probeWebSocket(conn) {
    this._upgradeTimer = null;
    if (conn !== this._conn || !this._welcomed) return;
    let ws;
    try {
      ws = new this._opts.WebSocket(this._urls.ws, SUBPROTOCOL);
    } catch {
      this._scheduleUpgrade(conn);
      return;
    }
    const probe = { ws, timer: null };
    const finish = (opened) => {
      if (this._probe !== probe) return;
      this._endProbe();
      if (conn !== this._conn || !this._welcomed) return;
      // Moved between two polls, with no POST in flight: nothing is lost on the way.
      if (opened) conn.handOver(() => this._upgrade(conn));
      else this._scheduleUpgrade(conn);
    };
    this._probe = probe;
    ws.onopen = () => finish(true);
    ws.onerror = () => {};
    ws.onclose = () => finish(false);
    probe.timer = setTimeout(() => finish(false), this._opts.wsOpenTimeoutMs);
  },

  _endProbe() {
    const probe = this._probe;
    if (!probe) return;
    this._probe = null;
    clearTimeout(probe.timer);
    const ws = probe.ws;
    ws.onopen = ws.onclose = ws.onerror = null;
    try {
      ws.close(1000, "probe");
    } catch {
      // already closing
    }
  },

  _cancelUpgrade() {
    clearTimeout(this._upgradeTimer);
    this._upgradeTimer = null;
    this._endProbe();
  },

  /** Called by the long-poll connection when nothing is in flight either way. */
  _upgrade(conn) {
    if (conn !== this._conn || !this._welcomed || this.state === "closed") return;
    conn.close();
    this._conn = null;
    this._welcomed = false;
    this._tryLongPoll = false;
    this._resetQueues(); // a resumed session starts with no queue item outstanding (§5)
    this._connect(); // auto picks a WebSocket now; HELLO carries the resume token
  },

  // ----- new or resumed session, heartbeats, shutdown ----------------------------------------

  /** The server kept our session: only what may have been lost in flight needs repeating. */
  _resumeSession() {
    for (const wire of [...this._wires.values()]) {
      if (wire.state !== "pending") continue;
      if (wire.closing) {
        // Unwanted anyway; a late SUBSCRIBED for its req still triggers the UNSUBSCRIBE.
        wire.state = "closed";
        this._wires.delete(wire.key);
      } else {
        // The SUBSCRIBE may have died with the connection: ask again. If both answers come,
        // the second is taken as a repositioning (_onRepositioned); the duplicate filter drops
        // what it replays again.
        wire.state = "unsent";
      }
    }
  },

  /** A new session: nothing the server knew about us survives. */
  _newSession() {
    this._sessionGen++;
    const lost = new RubrisError(
      "the session was lost with the connection; the call may or may not have run",
      ErrorCode.SESSION_EXPIRED,
    );
    for (const rec of [...this._calls.values()]) {
      if (rec.sent) this._failCall(rec, lost);
    }
    this._byTopic.clear();
    this._byReq.clear();
    this._unsubPending.clear();
    this._ackDirty.clear();
    clearTimeout(this._ackTimer);
    this._ackTimer = null;
    for (const wire of [...this._wires.values()]) {
      if (wire.closing) {
        wire.state = "closed";
        this._wires.delete(wire.key);
        continue;
      }
      wire.state = "unsent";
      wire.topic = null;
      wire.reqs.clear();
      wire.asked.clear();
      // A new session has new private and queue state; ring, keyed and snapshot numbering
      // belongs to the topic and survives (that is what epoch + since recover).
      if (wire.mode === Mode.PRIVATE || wire.mode === Mode.QUEUE) wire.resetNumbering();
    }
    // The rings restated in HELLO's frame reached the new session as SUBSCRIBEs with epoch and
    // since: they are its re-subscriptions, answered like any other (a wire let go meanwhile is
    // closed, and _onSubscribed gives its topic back).
    for (const [req, wire] of this._restating) {
      this._byReq.set(req, wire);
      if (wire.state === "unsent") {
        wire.state = "pending";
        wire.reqs.add(req);
      }
    }
    this._outbox = this._outbox.filter((e) => e.keep === "always");
  },

  _heartbeat(conn) {
    if (conn !== this._conn) return;
    const t = now();
    if (t - this._lastRx > 2 * this._heartbeatMs) {
      this._dropConn(conn, { reason: `nothing received for ${Math.round(t - this._lastRx)} ms` });
      return;
    }
    if (t - this._lastPing >= this._heartbeatMs * 0.95) this._sendPing();
  },

  /** PING the server: the heartbeat on WebSocket, and the round-trip time on both transports. */
  _sendPing() {
    const t = now();
    this._lastPing = t;
    const token = ++this._pingToken;
    this._pingSent.set(token, t);
    if (this._pingSent.size > 16) this._pingSent.delete(this._pingSent.keys().next().value);
    this._write({ bytes: encode.ping(token), keep: "none" });
  },

  _shutdown(err) {
    this._cancelUpgrade();
    clearTimeout(this._reconnectTimer);
    clearInterval(this._hbTimer);
    clearTimeout(this._ackTimer);
    clearInterval(this._nakTimer);
    this._reconnectTimer = this._hbTimer = this._ackTimer = this._nakTimer = null;
    const conn = this._conn;
    this._conn = null;
    this._welcomed = false;
    if (conn) {
      clearTimeout(conn.openTimer);
      conn.close(1000, "client closed");
    }
    this._removePageHooks();
    this.state = "closed";
    const reason = err ?? new RubrisError("client closed", ErrorCode.CLOSED);
    for (const rec of [...this._calls.values()]) this._failCall(rec, reason);
    this._outbox = [];
    this._tx = [];
    this._inbox = []; // nothing more reaches the app after close
    this._inboxHead = 0;
    for (const wire of this._wires.values()) {
      wire.state = "closed";
      for (const sub of [...wire.joining, ...wire.listeners]) sub._fail(reason);
      this._endQueue(wire, reason);
    }
    this._wires.clear();
    this._byTopic.clear();
    this._byReq.clear();
    this._restating.clear();
    if (err) this._emit("error", { code: err.code, message: err.message });
    this._emit("state", { state: "closed", transport: this.transport, resumed: this.resumed });
  },

  _setState(state, always = false) {
    if (this.state === state && !always) return;
    this.state = state;
    this._emit("state", { state, transport: this.transport, resumed: this.resumed });
  },

  // ----- inbound frames ----------------------------------------------------------------------

  _onFrame(conn, bytes, decoded) {
    if (conn !== this._conn) return;
    // Liveness is measured at arrival, not delivery: a backlog in the app is not a dead link.
    this._lastRx = now();
    if (this._welcomed) {
      conn.framesAfterWelcome++;
      if (conn.kind === "websocket") this._wsWorked = true;
    }
    this._counters.frames++;
    this._counters.bytesIn += bytes.length;
    let messages;
    try {
      messages = decoded ?? decodeFrame(bytes);
    } catch (err) {
      this._protocolError(conn, err.message);
      return;
    }
    this._counters.messages += messages.length;
    this._rate.add(messages.length);
    for (const m of messages) {
      if (!this._welcomed && m.kind !== Kind.WELCOME && m.kind !== Kind.GOODBYE) {
        this._protocolError(conn, `kind 0x${m.kind.toString(16)} before WELCOME`);
        return;
      }
      this._handle(conn, m);
      if (conn !== this._conn) return; // the message ended this connection (GOODBYE, error)
    }
  },

  /**
   * Protocol state changes happen here, at arrival, so topic numbers and call ids always mean
   * what they meant when the server sent them; what the app sees goes through the inbound queue
   * in the same order.
   */
  _handle(conn, m) {
    switch (m.kind) {
      case Kind.WELCOME:
        if (this._welcomed) this._protocolError(conn, "second WELCOME on one connection");
        else this._onWelcome(conn, m);
        break;
      case Kind.PUSH:
        this._onPush(m);
        break;
      case Kind.ITEM:
        this._onItem(m);
        break;
      case Kind.REVOKE:
        this._onRevoke(m);
        break;
      case Kind.ENTRY:
        this._onEntry(m);
        break;
      case Kind.RESULT:
      case Kind.STREAM:
        this._onReply(m);
        break;
      case Kind.SUBSCRIBED:
        this._onSubscribed(m);
        break;
      case Kind.REJECTED:
        this._onRejected(m);
        break;
      case Kind.UNSUBSCRIBED:
        this._onUnsubscribed(m);
        break;
      case Kind.GAP:
        this._onGap(m);
        break;
      case Kind.PONG: {
        const sent = this._pingSent.get(m.token);
        if (sent !== undefined) {
          this._rtt = Math.round(now() - sent);
          this._pingSent.delete(m.token);
        }
        break;
      }
      case Kind.GOODBYE:
        this._onGoodbye(conn, m);
        break;
      case Kind.FLOW:
        this._emit("flow", { fill: m.fill });
        break;
      default:
        break;
    }
  },

  _onGoodbye(conn, m) {
    this._emit("goodbye", { code: m.code, reason: m.reason });
    if (m.code === ErrorCode.SESSION_EXPIRED) this._resume = "";
    const fatal = m.code === ErrorCode.NOT_AUTHORISED || m.code === ErrorCode.UNSUPPORTED_VERSION;
    this._dropConn(conn, {
      goodbye: m, fatal, code: m.code, reason: m.reason || `server said goodbye (code ${m.code})`,
    });
  },

  // ----- page hooks --------------------------------------------------------------------------

  _installPageHooks() {
    if (typeof addEventListener !== "function") return;
    this._onPageHide = () => this._flushAcks(true);
    this._onVisibility = () => {
      if (typeof document !== "undefined" && document.visibilityState === "hidden") this._flushAcks(true);
    };
    this._onOnline = () => {
      // The network is back: no reason to sit out the rest of a backoff.
      if (this._reconnectTimer) {
        clearTimeout(this._reconnectTimer);
        this._connect();
      }
    };
    addEventListener("pagehide", this._onPageHide);
    addEventListener("online", this._onOnline);
    if (typeof document !== "undefined") document.addEventListener("visibilitychange", this._onVisibility);
  },

  _removePageHooks() {
    if (!this._onPageHide || typeof removeEventListener !== "function") return;
    removeEventListener("pagehide", this._onPageHide);
    removeEventListener("online", this._onOnline);
    if (typeof document !== "undefined") document.removeEventListener("visibilitychange", this._onVisibility);
  },
};
