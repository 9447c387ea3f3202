// The gateway as the page talks to it: the API key (asked for once, on a 401, kept in
// localStorage), HTTP with "Authorization: Bearer KEY", WebSockets with the key as the
// subprotocol "vlmq.bearer.KEY" (browsers cannot set headers on a WebSocket).

const KEY_ITEM = "vlmq.apiKey";

export class ApiError extends Error {
  constructor(status, message, code = null, retryAfter = null) {
    super(message);
    this.status = status;
    this.code = code;
    this.retryAfter = retryAfter;
  }
}

export const apiKey = {
  get: () => localStorage.getItem(KEY_ITEM) || "",
  set: (key) => localStorage.setItem(KEY_ITEM, key.trim()),
  clear: () => localStorage.removeItem(KEY_ITEM),
};

// Set by the page: shows the key dialog with the server's reason; resolves true once a key is saved.
let askForKey = async () => false;
export function whenKeyNeeded(ask) {
  askForKey = ask;
}

// JSON from the server's answer, or an ApiError carrying the server's own message.
export async function request(path, init = {}, retried = false) {
  const headers = new Headers(init.headers || {});
  if (apiKey.get()) headers.set("Authorization", `Bearer ${apiKey.get()}`);
  let response;
  try {
    response = await fetch(path, { ...init, headers });
  } catch (err) {
    throw new ApiError(0, `the server cannot be reached (${err.message})`, "network");
  }
  if (response.ok) return response.json();
  const error = await errorOf(response);
  if (error.status === 401 && !retried && (await askForKey(error.message))) {
    return request(path, init, true);
  }
  throw error;
}

async function errorOf(response) {
  let message = `${response.status} ${response.statusText}`;
  let code = null;
  try {
    const body = await response.json();
    const error = body.error || body;
    message = (typeof error === "string" ? error : error.message) || message;
    code = error.code || null;
  } catch {
    // not JSON (a proxy's page): the status line says what we know
  }
  return new ApiError(response.status, message, code, response.headers.get("Retry-After"));
}

// Called again with the same arguments after a 401 close once a new key is saved.
export function openJobStream(jobId, lastEventId) {
  const url = new URL(`/v1/jobs/${encodeURIComponent(jobId)}/stream`, location.href);
  url.protocol = url.protocol === "https:" ? "wss:" : "ws:";
  if (lastEventId) url.searchParams.set("last_event_id", lastEventId);
  const protocols = ["vlmq.v1"];
  if (apiKey.get()) protocols.push(`vlmq.bearer.${apiKey.get()}`);
  try {
    return new WebSocket(url, protocols);
  } catch (err) {
    // SyntaxError: the key has characters a subprotocol cannot carry
    throw new ApiError(401, `this API key cannot be sent over a WebSocket (${err.message})`, "bad_key");
  }
}

export async function keyAccepted(message) {
  return askForKey(message);
}
