// One job's events over WS /v1/jobs/{id}/stream until its terminal event. A dropped connection is
// resumed from the last event id (the server sends every token once, never a gap); a close for a
// missing or wrong key (1008) asks for the key and connects again.
import { ApiError, keyAccepted, openJobStream } from "./api.js";

const TERMINAL = new Set(["done", "failed", "cancelled", "expired"]);
const MAX_RECONNECTS = 5;
const POLICY_VIOLATION = 1008;

export function isTerminal(event) {
  return event.type === "done" || (typeof event.status === "string" && TERMINAL.has(event.status));
}

function messageOf(event) {
  if (!event) return "";
  return typeof event.error === "object" && event.error ? event.error.message : event.error || "";
}

export class JobStream {
  // on: { status(status, attempt), token(text, attempt), end(terminalEvent), fail(ApiError) }
  constructor(jobId, on) {
    this.jobId = jobId;
    this.on = on;
    this.lastId = null;
    this.reconnects = 0;
    this.ended = false;
    this.refusal = null; // an error message the server sends before it closes
  }

  start() {
    try {
      this.ws = openJobStream(this.jobId, this.lastId);
    } catch (err) {
      this.fail(err);
      return;
    }
    this.ws.onmessage = (message) => this.receive(JSON.parse(message.data));
    this.ws.onclose = (close) => this.closed(close);
  }

  receive(event) {
    if (event.id) this.lastId = event.id;
    this.reconnects = 0;
    if (event.type === "token") {
      this.on.token(event.text || "", event.attempt || 1);
    } else if (isTerminal(event)) {
      this.ended = true;
      this.on.end(event);
    } else if (event.type === "status") {
      this.on.status(event.status, event.attempt || 1);
    } else if (event.type === "error") {
      this.refusal = event;
    }
  }

  async closed(close) {
    if (this.ended) return;
    const reason = messageOf(this.refusal) || close.reason;
    this.refusal = null;
    if (close.code === POLICY_VIOLATION) {
      if (await keyAccepted(reason)) this.start();
      else this.fail(new ApiError(401, reason || "API key missing or wrong", "invalid_api_key"));
    } else if (close.code >= 4000 && close.code < 5000) {
      this.fail(new ApiError(close.code - 4000, reason));
    } else if (this.reconnects < MAX_RECONNECTS) {
      this.reconnects += 1;
      setTimeout(() => this.start(), 300 * this.reconnects);
    } else {
      this.fail(new ApiError(0, "the answer's stream was lost (the job may still finish)", "network"));
    }
  }

  fail(error) {
    this.ended = true;
    this.on.fail(error);
  }

  close() {
    this.ended = true;
    if (this.ws) this.ws.close();
  }
}
