// Small DOM and formatting helpers shared by the views.

/** sessionStorage key of the submit form's text ("Edit & resubmit" puts a run's spec there). */
export const DRAFT_KEY = "tessera.submit.draft";

/** `el("a", {href: "#/runs", class: "x"}, "text", child)`: create an element. */
export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "class") node.className = value;
    else if (key === "dataset") Object.assign(node.dataset, value);
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value === true ? "" : value);
  }
  for (const child of children.flat()) {
    if (child === undefined || child === null || child === false) continue;
    node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

/** Set an element's text only when it differs (keeps selection and avoids layout work). */
export function setText(node, text) {
  const value = String(text);
  if (node.textContent !== value) node.textContent = value;
}

// Status is always written out; the symbol and colour only repeat it.
// Sweeps use the same words (QUEUED … CANCELED), so they share the badges.
const STATUS_SYMBOL = {
  QUEUED: "◷", STARTING: "…", RUNNING: "▶", RESTARTING: "↻",
  COMPLETED: "✓", FAILED: "✕", CANCELING: "■", CANCELED: "■", STOPPED: "⇥",
};
// STOPPED is a sweep trial its scheduler (ASHA) ended early: not a failure, so say so.
const STATUS_LABEL = { STOPPED: "STOPPED early" };
const STATUS_TITLE = { STOPPED: "stopped early by the sweep's scheduler (not a failure)" };
export const STATUSES = Object.keys(STATUS_SYMBOL);
export const TERMINAL = new Set(["COMPLETED", "FAILED", "CANCELED", "STOPPED"]);
/** Statuses from which POST /runs/{id}/resume starts a new attempt. */
export const RESUMABLE = new Set(["FAILED", "CANCELED", "STOPPED"]);

/** The lists' archived filter, as the API's `archived` query takes it: hidden, only, or both. */
export const ARCHIVED_CHOICES = [["false", "not archived"], ["true", "archived"], ["all", "archived or not"]];

/** `archived` from a page's URL query: one of ARCHIVED_CHOICES' values ("false" when absent or unknown). */
export function archivedOf(query) {
  const value = query.get("archived");
  return ARCHIVED_CHOICES.some(([v]) => v === value) ? value : "false";
}

/** A list page's hash with its filters as the URL query, in the order given; empty values and
 *  `archived: "false"` (the default) are left out: `listHash("sweeps", {name: "lr"})` is `#/sweeps?name=lr`. */
export function listHash(page, filters) {
  const query = new URLSearchParams();
  for (const [key, value] of Object.entries(filters)) {
    if (value && !(key === "archived" && value === "false")) query.set(key, value);
  }
  const text = query.toString();
  return text ? `#/${page}?${text}` : `#/${page}`;
}

/** The archived filter's select (`id`), which calls `onChange(value)`. */
export function archivedFilter(id, value, onChange) {
  return el("select", { id, "aria-label": "Archived", onchange: (e) => onChange(e.target.value) },
    ARCHIVED_CHOICES.map(([v, label]) => el("option", { value: v, selected: v === value }, label)));
}

/** Where a QUEUED run waits: "#2 in the queue · waiting for resources (detail)"; "" otherwise. */
export function queueText(run) {
  if (!run.queue) return "";
  const { position, reason, detail } = run.queue;
  return `#${position} in the queue · waiting for ${reason}${detail ? ` (${detail})` : ""}`;
}

export function statusBadge(status) {
  return el("span", { class: `badge status-${status.toLowerCase()}`, dataset: { status }, title: STATUS_TITLE[status] },
    el("span", { class: "badge-symbol", "aria-hidden": "true" }, STATUS_SYMBOL[status] || "?"),
    ` ${STATUS_LABEL[status] || status}`);
}

export function updateStatusBadge(badge, status) {
  if (badge.dataset.status === status) return;
  badge.replaceWith(statusBadge(status));
}

/** A progress bar with its percentage as text; `fraction` may be undefined (unknown). */
export function progressBar(fraction, detail = "") {
  const wrap = el("div", { class: "progress" });
  updateProgressBar(wrap, fraction, detail);
  return wrap;
}

export function updateProgressBar(wrap, fraction, detail = "") {
  const known = typeof fraction === "number" && Number.isFinite(fraction);
  const pct = known ? Math.max(0, Math.min(1, fraction)) * 100 : 0;
  const label = known ? `${pct.toFixed(pct < 10 && pct > 0 ? 1 : 0)}%` : "–";
  const key = `${label}|${detail}`;
  if (wrap.dataset.key === key) return;
  wrap.dataset.key = key;
  wrap.replaceChildren(...[
    el("div", { class: "progress-track", role: "progressbar", "aria-valuemin": "0", "aria-valuemax": "100",
                "aria-valuenow": known ? pct.toFixed(0) : undefined, "aria-label": "progress" },
      el("div", { class: "progress-fill", style: `width: ${pct}%` })),
    el("span", { class: "progress-label" }, label),
    detail ? el("span", { class: "progress-detail" }, detail) : null,
  ].filter(Boolean));
}

/** Progress of a run from its summary: `time/progress` (0..1) and the batch/epoch counters. */
export function runProgress(run) {
  const s = run.summary || {};
  let fraction = s["time/progress"];
  if (run.status === "COMPLETED") fraction = 1;
  const unit = String(run.spec?.max_duration || "").replace(/^[\d.]+/, "");
  const counter = unit === "ep" ? s["time/epoch"] : unit === "ba" ? s["time/batch"] : undefined;
  const detail = counter !== undefined ? `${counter}/${run.spec.max_duration}` : "";
  return { fraction, detail };
}

/** Server times are ISO 8601 in UTC; a missing zone would be read as local time, so add one. */
export function parseTime(value) {
  if (!value) return null;
  const text = /[zZ]|[+-]\d\d:?\d\d$/.test(value) ? value : `${value}Z`;
  const date = new Date(text);
  return Number.isNaN(date.getTime()) ? null : date;
}

/** "45s", "12m 03s", "1h 14m", "3d 2h" ("–" for a negative one); the CLI's `duration_text`
 *  (cli/run_info.py) writes the same: keep the two alike. */
export function formatDuration(ms) {
  if (ms === null || ms === undefined || !Number.isFinite(ms) || ms < 0) return "–";
  const s = Math.floor(ms / 1000);
  if (s < 60) return `${s}s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m}m ${String(s % 60).padStart(2, "0")}s`;
  const h = Math.floor(m / 60);
  if (h < 48) return `${h}h ${String(m % 60).padStart(2, "0")}m`;
  return `${Math.floor(h / 24)}d ${h % 24}h`;
}

/** A duration given in seconds (sweeps' wall times); tenths below 10 s, where they matter. */
export function formatSeconds(seconds) {
  if (typeof seconds !== "number" || !Number.isFinite(seconds)) return "–";
  return seconds < 10 ? `${seconds.toFixed(1)}s` : formatDuration(seconds * 1000);
}

/** The wall-clock span of a run or sweep: its first start to its end, to now while it has not
 *  ended (or how long it has waited, if it has not started). A run's Duration is `trainedDuration`. */
export function runSpan(run, now = Date.now()) {
  const started = parseTime(run.started_at);
  const finished = parseTime(run.finished_at);
  if (started) return formatDuration((finished ? finished.getTime() : now) - started.getTime());
  if (finished) return "–";
  const created = parseTime(run.created_at);
  return created ? `waiting ${formatDuration(now - created.getTime())}` : "–";
}

/** Milliseconds a run trained up to `now`: its ended attempts (RunView.trained_seconds) and, while
 *  an attempt trains, the time since it began (training_since); null from a service older than it. */
export function trainedMs(run, now = Date.now()) {
  if (typeof run.trained_seconds !== "number") return null;
  const since = parseTime(run.training_since);
  return run.trained_seconds * 1000 + (since ? Math.max(0, now - since.getTime()) : 0);
}

const TRAINED_TITLE = "time trained: each attempt from when it began training to its end, summed over the " +
  "run's attempts; time queued or starting between attempts is left out";
const SPAN_TITLE = "wall-clock time from the run's first start to its end (to now while it has not ended), " +
  "waits between attempts included";

/** What a run's Duration (`trainedDuration`) is, as a tooltip; undefined before it first trained. */
export function trainedTitle(run) {
  if (!run.started_at) return undefined;
  return typeof run.trained_seconds === "number" ? TRAINED_TITLE : SPAN_TITLE;
}

/** A run's Duration: how long it trained, its waits between attempts left out ("12m 03s"); before
 *  it first trained, how long it has waited; the wall-clock span from a service that does not say. */
export function trainedDuration(run, now = Date.now()) {
  const trained = trainedMs(run, now);
  return trained === null || !run.started_at ? runSpan(run, now) : formatDuration(trained);
}

/** The wall-clock span where it reads otherwise than the time trained (a run queued or starting
 *  again between attempts): "1h 14m from first start to end, 2 attempts"; null where it reads the same. */
export function spanNote(run, now = Date.now()) {
  if (trainedMs(run, now) === null || !run.started_at) return null;
  const span = runSpan(run, now);
  if (span === trainedDuration(run, now)) return null;
  const attempts = `${run.attempt} attempt${run.attempt === 1 ? "" : "s"}`;
  return `${span} from first start to ${run.finished_at ? "end" : "now"}, ${attempts}`;
}

/** Fill a run page's Duration fact: the time trained, then the span where that reads otherwise, each
 *  with a tooltip saying which it is. Called every poll: the DOM changes only when the text does. */
export function renderDurationFact(node, run, now = Date.now()) {
  const trained = trainedDuration(run, now);
  const span = spanNote(run, now);
  const key = `${trained}|${span}`;
  if (node.dataset.key === key) return;
  node.dataset.key = key;
  node.replaceChildren(el("span", { class: "duration-trained", title: trainedTitle(run) }, trained),
    ...(span ? [" ", el("span", { class: "muted duration-span", title: SPAN_TITLE }, `(${span})`)] : []));
}

export function formatClock(date) {
  return date.toLocaleTimeString(undefined, { hour: "2-digit", minute: "2-digit", second: "2-digit", hour12: false });
}

/** Local time: "14:03:07" today, "Nov 28 14:03" this year, else with the year. */
export function formatTime(value) {
  const date = value instanceof Date ? value : parseTime(value);
  if (!date) return "–";
  const now = new Date();
  const clock = formatClock(date);
  if (date.toDateString() === now.toDateString()) return clock;
  const day = date.toLocaleDateString(undefined, { month: "short", day: "numeric",
    year: date.getFullYear() === now.getFullYear() ? undefined : "numeric" });
  return `${day} ${clock.slice(0, 5)}`;
}

export function formatNumber(value) {
  if (typeof value !== "number" || !Number.isFinite(value)) return "–";
  if (value !== 0 && (Math.abs(value) >= 1e5 || Math.abs(value) < 1e-3)) return value.toExponential(2);
  return Number(value.toPrecision(4)).toString();
}

export function formatBytes(n) {
  if (typeof n !== "number" || !Number.isFinite(n)) return "–";
  const units = ["B", "KB", "MB", "GB", "TB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i += 1; }
  return `${i ? n.toFixed(1) : n} ${units[i]}`;
}

/** The metric a run is judged by, as `[label, value]`: eval accuracy, else eval loss, else train loss. */
export function headlineMetric(summary = {}) {
  for (const key of ["eval/accuracy", "eval/perplexity", "eval/loss", "train/loss"]) {
    if (typeof summary[key] === "number") return [key, summary[key]];
  }
  return null;
}

/** A run's best value (RunView.best, by each key's mode) as `[label, value]`: eval accuracy,
 *  else eval perplexity, else train loss. */
export function bestMetric(best = {}) {
  for (const key of ["eval/accuracy", "eval/perplexity", "train/loss"]) {
    if (typeof best[key] === "number") return [key, best[key]];
  }
  return null;
}

/** Chips for a spec's algorithms (or a plain list of names). */
export function algorithmChips(spec) {
  const names = Array.isArray(spec) ? spec : (spec?.algorithms || []).map((a) => a.name);
  if (!names.length) return el("span", { class: "muted" }, "none");
  return el("ul", { class: "chips", "aria-label": "algorithms" }, names.map((n) => el("li", { class: "chip" }, n)));
}

export function errorBox(message) {
  return el("div", { class: "error-box", role: "alert" }, message);
}

const ERROR_HEADLINE_CHARS = 200;

/** A run's or sweep's error, each part of it shown once: a short one-line error as it is; a
 *  longer one (a traceback, a log's last lines) as its first line, opening onto the rest. */
export function errorDetails(error) {
  const [first, ...more] = error.trim().split("\n");
  const rest = more.join("\n");
  if (!rest && first.length <= ERROR_HEADLINE_CHARS) return el("p", { class: "error-box" }, `Error: ${first}`);
  const cut = first.length > ERROR_HEADLINE_CHARS; // then the summary is a preview, and the whole text follows
  return el("details", { class: "error-box", open: true },
    el("summary", {}, `Error: ${cut ? `${first.slice(0, ERROR_HEADLINE_CHARS)}…` : first}`),
    el("pre", {}, cut ? error.trim() : rest));
}
