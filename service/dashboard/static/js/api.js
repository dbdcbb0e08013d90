// Talking to /api/v1: fetch with a timeout, ETag revalidation, typed errors, and a Poller
// that never overlaps its own requests, backs off while the API fails, and pauses in
// background tabs. Views do all their polling through a Poller.

export const API = "/api/v1";
const REQUEST_TIMEOUT_MS = 10_000;
const MAX_BACKOFF_MS = 30_000;

export class ApiError extends Error {
  /** An HTTP error answer: `status` and the body's `detail` (a string, or a list of field errors on 422). */
  constructor(status, detail) {
    super(typeof detail === "string" ? detail : `HTTP ${status}`);
    this.status = status;
    this.detail = detail;
  }
}

/** An error as one line for the user; a 422's field errors as `field: message; ...`. */
export function errorText(error) {
  if (error instanceof ApiError && Array.isArray(error.detail)) {
    return error.detail.map((d) => (d && d.field ? `${d.field}: ${d.msg}` : JSON.stringify(d))).join("; ");
  }
  return error.message;
}

/** Whether trying again later may help: the network, a timeout, a 5xx, 408 or 429. */
export function isTransient(error) {
  if (!(error instanceof ApiError)) return true;
  return error.status >= 500 || error.status === 408 || error.status === 429;
}

// Last ETag and body per URL, for `If-None-Match`. Bounded: a long session visits many runs.
const etagCache = new Map();
const ETAG_CACHE_SIZE = 64;

/**
 * One request to the API. Returns `{data, changed}`; `changed` is false when a conditional
 * GET came back 304 (then `data` is the body seen last time).
 */
export async function request(method, path, options = {}) {
  try {
    return await requestOnce(method, path, options);
  } catch (error) {
    // No key yet, or a revoked one: ask once (every request waiting on the same answer), retry.
    if (!(error instanceof ApiError) || error.status !== 401) throw error;
    await askForKey(error);
    return requestOnce(method, path, options);
  }
}

// --- the API key: asked once, kept in sessionStorage, sent as a header (never a cookie) -----

const KEY_STORAGE = "tessera.apiKey";
const PROJECT_STORAGE = "tessera.project";
let pendingKey = null;

export function apiKey() { return sessionStorage.getItem(KEY_STORAGE); }

/** The project chosen in the switcher, or "" for all of the key's projects. */
export function currentProject() { return sessionStorage.getItem(PROJECT_STORAGE) || ""; }
export function setCurrentProject(name) { sessionStorage.setItem(PROJECT_STORAGE, name || ""); }

/** Show the key prompt (one at a time) and resolve once the user has entered a key. */
export function askForKey(error) {
  if (!pendingKey) {
    pendingKey = new Promise((resolve) => {
      const dialog = document.createElement("dialog");
      dialog.id = "key-dialog";
      dialog.setAttribute("aria-labelledby", "key-dialog-title");
      dialog.innerHTML = `<form method="dialog" id="key-form">
        <h2 id="key-dialog-title">API key</h2>
        <p class="muted small">This service needs an API key (<code>tsk_…</code>). The embedded service wrote
        its first one to <code>$TESSERA_HOME/credentials</code> (default <code>.tessera/credentials</code>);
        an admin can make one with <code>tessera keys create</code>. It is kept for this tab only.</p>
        <label for="key-input">Key</label> <input id="key-input" type="password" autocomplete="off" required>
        <p class="field-error" id="key-error" role="alert" hidden></p>
        <div class="actions"><button type="submit" class="primary" id="key-submit">Use this key</button></div>
      </form>`;
      if (apiKey()) {
        const refused = dialog.querySelector("#key-error");
        refused.textContent = "The service refused the key (revoked or wrong): enter another.";
        refused.hidden = false;
      }
      dialog.addEventListener("cancel", (event) => event.preventDefault());
      dialog.querySelector("form").addEventListener("submit", (event) => {
        // The dialog (and its form) goes below, before the browser's own method="dialog"
        // submission would run: that submission, of a form no longer in the page, only logs
        // "Form submission canceled because the form is not connected". Close it here instead.
        event.preventDefault();
        sessionStorage.setItem(KEY_STORAGE, dialog.querySelector("#key-input").value.trim());
        dialog.close();
        dialog.remove();
        pendingKey = null;
        window.dispatchEvent(new Event("tessera:key"));
        resolve();
      });
      document.body.append(dialog);
      dialog.showModal();
    });
  }
  return pendingKey;
}

/** Runs and sweeps are listed and created in the chosen project (the API's `project` parameter). */
function withProject(method, path) {
  const project = currentProject();
  const base = path.split("?")[0];
  const scoped = (method === "GET" || method === "POST") && (base === "/runs" || base === "/sweeps");
  if (!project || !scoped) return path;
  return `${path}${path.includes("?") ? "&" : "?"}project=${encodeURIComponent(project)}`;
}

async function requestOnce(method, path, { body, conditional = false } = {}) {
  const url = API + withProject(method, path);
  const headers = { Accept: "application/json" };
  if (apiKey()) headers.Authorization = `Bearer ${apiKey()}`;
  const cached = conditional ? etagCache.get(url) : undefined;
  if (cached) headers["If-None-Match"] = cached.etag;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const controller = new AbortController();
  const timer = setTimeout(() => controller.abort(), REQUEST_TIMEOUT_MS);
  let response;
  try {
    // no-store: the browser's cache must not answer for us; we revalidate with our own ETag.
    response = await fetch(url, {
      method, headers, cache: "no-store", signal: controller.signal,
      body: body === undefined ? undefined : JSON.stringify(body),
    });
  } catch (error) {
    throw new Error(error.name === "AbortError"
      ? `no answer from ${url} in ${REQUEST_TIMEOUT_MS / 1000}s`
      : `cannot reach the API (${error.message})`);
  } finally {
    clearTimeout(timer);
  }
  if (response.status === 304 && cached) return { data: cached.data, changed: false };
  const text = await response.text();
  let data = null;
  if (text) {
    try { data = JSON.parse(text); } catch { data = text; }
  }
  if (!response.ok) {
    const detail = data && typeof data === "object" && "detail" in data ? data.detail : data || response.statusText;
    throw new ApiError(response.status, detail);
  }
  const etag = response.headers.get("ETag");
  if (conditional && etag) {
    etagCache.delete(url);
    etagCache.set(url, { etag, data });
    if (etagCache.size > ETAG_CACHE_SIZE) etagCache.delete(etagCache.keys().next().value);
  }
  return { data, changed: true };
}

export const getJSON = async (path) => (await request("GET", path)).data;
export const getIfChanged = (path) => request("GET", path, { conditional: true });
export const postJSON = async (path, body) => (await request("POST", path, { body })).data;

/**
 * Download `path` as a file named `filename`. A plain link cannot send the API key (a header,
 * never a cookie), so the bytes are fetched with it and handed to the browser as a blob.
 */
export async function downloadFile(path, filename) {
  const response = await fetch(API + path, { headers: { Authorization: `Bearer ${apiKey()}` } });
  if (!response.ok) {
    let detail = response.statusText;
    try { detail = (await response.json()).detail; } catch { /* not JSON */ }
    throw new ApiError(response.status, detail);
  }
  const url = URL.createObjectURL(await response.blob());
  const link = Object.assign(document.createElement("a"), { href: url, download: filename });
  document.body.append(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(url), 60_000);
}

export async function getText(path) {
  const response = await fetch(API + path, { cache: "no-store" });
  if (!response.ok) throw new ApiError(response.status, response.statusText);
  return response.text();
}

/**
 * Runs `task` every `intervalMs`, one call at a time. While it fails with a transient error
 * the delay doubles (up to 30 s, with a little jitter so many tabs do not retry in step);
 * the first success returns to the normal interval. A non-transient error stops the poller.
 * `onState({ok, at, error, retryInMs, stopped})` reports every outcome (the "Live"/"Stale" badge).
 * `task` may return a number: the delay before the next call (a finished run polls slower).
 */
export class Poller {
  constructor(task, { intervalMs, onState = () => {} }) {
    this.task = task;
    this.intervalMs = intervalMs;
    this.onState = onState;
    this.failures = 0;
    this.timer = null;
    this.running = false;
    this.stopped = true;
    this.lastSuccess = null;
    this._onVisibility = () => { if (!document.hidden && !this.stopped && !this.running) this._schedule(0); };
  }

  start() {
    this.stopped = false;
    document.addEventListener("visibilitychange", this._onVisibility);
    this._schedule(0);
    return this;
  }

  stop() {
    this.stopped = true;
    clearTimeout(this.timer);
    document.removeEventListener("visibilitychange", this._onVisibility);
  }

  /** Poll now (e.g. after the user changed a filter or cancelled a run). */
  poke() {
    if (!this.stopped && !this.running) this._schedule(0);
  }

  _schedule(delayMs) {
    clearTimeout(this.timer);
    // A hidden tab asks for nothing; becoming visible polls at once (see _onVisibility).
    this.timer = setTimeout(() => { if (!document.hidden) this._tick(); }, delayMs);
  }

  async _tick() {
    if (this.stopped || this.running) return;
    this.running = true;
    let delay = this.intervalMs;
    try {
      const requested = await this.task();
      if (this.stopped) return; // the view went away while we waited
      if (typeof requested === "number") delay = requested;
      this.failures = 0;
      this.lastSuccess = new Date();
      this.onState({ ok: true, at: this.lastSuccess });
    } catch (error) {
      if (this.stopped) return;
      if (!isTransient(error)) {
        this.stop();
        this.onState({ ok: false, error, stopped: true, at: this.lastSuccess });
        return;
      }
      this.failures += 1;
      const backoff = Math.min(this.intervalMs * 2 ** this.failures, MAX_BACKOFF_MS);
      delay = backoff * (1 + 0.1 * Math.random());
      this.onState({ ok: false, error, retryInMs: delay, at: this.lastSuccess });
    } finally {
      this.running = false;
    }
    if (!this.stopped) this._schedule(delay);
  }
}
