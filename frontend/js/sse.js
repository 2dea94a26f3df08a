// Server-Sent Events over fetch: EventSource cannot send an Authorization header, so the
// stream is read with a ReadableStream and parsed here. A dropped stream reconnects with
// Last-Event-ID (the last cursor seen), so nothing between the drop and the resume is lost.

import { sleep } from "./dom.js";

/** An incremental parser of the text/event-stream format (WHATWG HTML §9.2.6). */
export class SSEParser {
  #buffer = "";
  #data = [];
  #type = "";
  /** The last event id seen (persists across events, as the spec says). */
  lastEventId = "";
  /** A reconnection delay the server asked for, in ms. */
  retry = null;

  constructor(onEvent) {
    this.onEvent = onEvent;
  }

  feed(chunk) {
    this.#buffer += chunk;
    let start = 0;
    for (let i = 0; i < this.#buffer.length; i++) {
      const c = this.#buffer[i];
      if (c !== "\n" && c !== "\r") continue;
      // A CR at the very end may be the first half of a CRLF split across chunks.
      if (c === "\r" && i === this.#buffer.length - 1) break;
      this.#line(this.#buffer.slice(start, i));
      if (c === "\r" && this.#buffer[i + 1] === "\n") i++;
      start = i + 1;
    }
    this.#buffer = this.#buffer.slice(start);
  }

  #line(line) {
    if (line === "") {
      this.#dispatch();
      return;
    }
    if (line.startsWith(":")) return; // a comment (keep-alive)
    const colon = line.indexOf(":");
    const field = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    if (field === "data") this.#data.push(value);
    else if (field === "event") this.#type = value;
    else if (field === "id" && !value.includes("\0")) this.lastEventId = value;
    else if (field === "retry" && /^\d+$/.test(value)) this.retry = Number(value);
  }

  #dispatch() {
    if (this.#data.length === 0) {
      this.#type = "";
      return;
    }
    const event = { type: this.#type || "message", data: this.#data.join("\n"), id: this.lastEventId };
    this.#data = [];
    this.#type = "";
    this.onEvent(event);
  }
}

/**
 * One reconnecting event stream.
 *   new EventStream({url, headers: () => ({Authorization}), onEvent, onStatus}).start()
 * onStatus receives "connecting" | "open" | "reconnecting" | "unauthorized" | "ended" | "closed".
 */
export class EventStream {
  #controller = null;
  #stopped = true;

  constructor({ url, headers = () => ({}), onEvent, onStatus = () => {}, minDelay = 500, maxDelay = 10_000 }) {
    this.url = url;
    this.headers = headers;
    this.onEvent = onEvent;
    this.onStatus = onStatus;
    this.lastEventId = ""; // until an event arrives, the URL (its ?after=) says where to start
    this.minDelay = minDelay;
    this.maxDelay = maxDelay;
    this.status = "closed";
  }

  start() {
    if (!this.#stopped) return;
    this.#stopped = false;
    this.#run();
  }

  stop() {
    this.#stopped = true;
    this.#controller?.abort();
    this.#setStatus("closed");
  }

  /** Drop the current connection and reconnect at once (resuming from the last cursor). */
  reconnect() {
    this.#controller?.abort();
  }

  #setStatus(status) {
    if (this.status === status) return;
    this.status = status;
    this.onStatus(status);
  }

  async #run() {
    let delay = this.minDelay;
    while (!this.#stopped) {
      const controller = new AbortController();
      this.#controller = controller;
      this.#setStatus(this.status === "closed" ? "connecting" : "reconnecting");
      try {
        const headers = { Accept: "text/event-stream", ...this.headers() };
        if (this.lastEventId) headers["Last-Event-ID"] = this.lastEventId;
        const response = await fetch(this.url, { headers, signal: controller.signal, cache: "no-store" });
        if (response.status === 401 || response.status === 403) {
          this.#stopped = true;
          this.#setStatus("unauthorized");
          return;
        }
        if (response.status === 204) {
          // The server's word that the stream is over for good (an archived tree, all of it sent).
          this.#stopped = true;
          this.#setStatus("ended");
          return;
        }
        if (!response.ok || !response.body) throw new Error(`HTTP ${response.status}`);
        this.#setStatus("open");
        delay = this.minDelay;
        const parser = new SSEParser((event) => {
          if (event.id) this.lastEventId = event.id;
          if (!this.#stopped) this.onEvent(event);
        });
        parser.lastEventId = this.lastEventId;
        const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          parser.feed(value);
          if (parser.retry) delay = parser.retry;
        }
      } catch (error) {
        if (error?.name !== "AbortError") console.debug("event stream dropped", error);
      }
      if (this.#stopped) return;
      this.#setStatus("reconnecting");
      await sleep(delay);
      delay = Math.min(delay * 2, this.maxDelay);
    }
  }
}
