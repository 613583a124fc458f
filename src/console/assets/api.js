// The protocol client the console (and plugins) use: JSON requests with the bearer token,
// the protocol's error body as an ApiError, and event streams that reconnect from the last
// seq they saw. Only the public /api routes.

const TOKEN_KEY = "kestrel.token";

export class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

export class Api {
  constructor() {
    this.token = localStorage.getItem(TOKEN_KEY) || "";
  }

  setToken(token) {
    this.token = token;
    if (token) localStorage.setItem(TOKEN_KEY, token);
    else localStorage.removeItem(TOKEN_KEY);
  }

  async call(method, path, body) {
    const headers = {};
    if (this.token) headers.Authorization = `Bearer ${this.token}`;
    if (body !== undefined) headers["Content-Type"] = "application/json";
    let response;
    try {
      response = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
    } catch (error) {
      throw new ApiError(0, "unreachable", `The server cannot be reached (${error.message}).`);
    }
    if (response.status === 204) return null;
    const text = await response.text();
    let parsed = null;
    try {
      parsed = text ? JSON.parse(text) : null;
    } catch {
      parsed = null;
    }
    if (!response.ok) {
      const error = (parsed && parsed.error) || {};
      throw new ApiError(response.status, error.code || "error", error.message || `HTTP ${response.status}`);
    }
    return parsed;
  }

  get(path) { return this.call("GET", path); }
  post(path, body) { return this.call("POST", path, body === undefined ? {} : body); }
  patch(path, body) { return this.call("PATCH", path, body); }
  remove(path) { return this.call("DELETE", path); }

  // A stream of envelopes from `path`, handed to `onEnvelope` in order. After a drop it
  // reconnects with ?lastEventId= (the browser's own retry cannot add the token) and calls
  // `onReconnect` once it is back, so a view can refetch what the server may no longer
  // replay; `onOpen` runs at every (re)connection, the first included. `from` replays after that seq at the first connection too. Returns a handle whose
  // close() ends it.
  stream(path, { from = null, onEnvelope, onOpen, onReconnect, onState }) {
    let lastSeq = from;
    let source = null;
    let closed = false;
    let retryTimer = null;
    let wasDown = false;
    const open = () => {
      const params = new URLSearchParams();
      if (this.token) params.set("token", this.token);
      if (lastSeq !== null) params.set("lastEventId", String(lastSeq));
      const query = params.toString();
      source = new EventSource(query ? `${path}?${query}` : path);
      source.onopen = () => {
        if (onState) onState("live");
        if (onOpen) onOpen();
        if (wasDown && onReconnect) onReconnect();
        wasDown = false;
      };
      source.onmessage = (message) => {
        let envelope;
        try {
          envelope = JSON.parse(message.data);
        } catch {
          return;
        }
        if (typeof envelope.seq === "number") lastSeq = envelope.seq;
        onEnvelope(envelope);
      };
      source.onerror = () => {
        source.close();
        if (closed) return;
        wasDown = true;
        if (onState) onState("reconnecting");
        retryTimer = setTimeout(open, 1000);
      };
    };
    open();
    return {
      close() {
        closed = true;
        clearTimeout(retryTimer);
        if (source) source.close();
      },
      lastSeq: () => lastSeq,
    };
  }
}

export const encodeId = (id) => encodeURIComponent(id);
