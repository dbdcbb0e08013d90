// Runs: the table a researcher keeps open. One conditional GET /runs per poll (ETag: a 304
// changes nothing but the running clocks); rows are keyed by run id and updated in place.
// Filters live in the URL (`#/runs?status=FAILED&sweep_id=...`), so a filtered view can be linked.

import { getIfChanged, getJSON, Poller } from "./api.js";
import {
  algorithmChips, bestMetric, el, formatNumber, formatTime, headlineMetric, progressBar, runDuration, runProgress,
  queueText, setText, statusBadge, STATUSES, TERMINAL, updateProgressBar, updateStatusBadge,
} from "./ui.js";

const PAGE_SIZE = 100;
const COLUMNS = ["Run", "Status", "Progress", "Algorithms", "Best", "Latest", "Restarts", "Duration", "Created"];

function runsHash({ status, sweepId }) {
  const query = new URLSearchParams();
  if (status) query.set("status", status);
  if (sweepId) query.set("sweep_id", sweepId);
  const text = query.toString();
  return text ? `#/runs?${text}` : "#/runs";
}

export function mount(root, ctx) {
  let alive = true;
  const status = STATUSES.includes(ctx.query.get("status")) ? ctx.query.get("status") : "";
  const sweepId = ctx.query.get("sweep_id") || "";
  const filter = el("select", { id: "status-filter", onchange: (e) => {
    window.location.hash = runsHash({ status: e.target.value, sweepId });
  } },
  el("option", { value: "" }, "all statuses"),
  STATUSES.map((s) => el("option", { value: s, selected: s === status }, s)));
  const sweepFilter = el("select", { id: "sweep-filter", onchange: (e) => {
    window.location.hash = runsHash({ status, sweepId: e.target.value });
  } },
  el("option", { value: "" }, "all runs"),
  sweepId ? el("option", { value: sweepId, selected: true }, sweepId) : null);
  // Shown once a run of a sweep is listed (or the URL filters by one); its choices load then.
  const sweepFilterBox = el("span", { class: "sweep-filter-box", hidden: !sweepId },
    el("label", { for: "sweep-filter" }, "Sweep "), sweepFilter);
  const sweepNote = el("p", { id: "sweep-note", hidden: !sweepId },
    "Trials of sweep ", el("a", { href: `#/sweeps/${encodeURIComponent(sweepId)}` }, sweepId),
    " · ", el("a", { href: runsHash({ status }) }, "show all runs"));
  const count = el("p", { class: "muted", id: "runs-count", "aria-live": "polite" });
  const tbody = el("tbody");
  const table = el("table", { class: "runs-table", id: "runs-table" },
    el("caption", { class: "visually-hidden" }, "Runs, newest first"),
    el("thead", {}, el("tr", {}, COLUMNS.map((h) => el("th", { scope: "col", class: `col-${columnId(h)}` }, h)))),
    tbody);
  const emptyText = sweepId ? `No ${status ? `${status} ` : ""}trials in this sweep.` : status ? `No ${status} runs.` : null;
  const empty = el("p", { class: "empty", hidden: true },
    emptyText || "No runs yet. ", emptyText ? null : el("a", { href: "#/submit" }, "Submit one."));
  root.append(
    el("div", { class: "page-head" },
      el("h1", {}, "Runs"),
      el("div", { class: "filters" }, sweepFilterBox, el("label", { for: "status-filter" }, "Status "), filter)),
    sweepNote,
    count,
    el("div", { class: "table-wrap" }, table),
    empty,
  );

  // The sweep filter's choices: loaded once (a service without sweeps just keeps "all runs").
  let sweepsLoaded = false;
  async function loadSweeps() {
    sweepsLoaded = true;
    sweepFilterBox.hidden = false;
    try {
      const sweeps = (await getJSON("/sweeps?limit=100")).data;
      if (!alive) return;
      const known = sweeps.find((s) => s.id === sweepId);
      if (known) setText(sweepNote.querySelector("a"), known.name);
      sweepFilter.replaceChildren(...[el("option", { value: "" }, "all runs"),
        ...sweeps.map((s) => el("option", { value: s.id, selected: s.id === sweepId }, s.name)),
        sweepId && !known ? el("option", { value: sweepId, selected: true }, sweepId) : null].filter(Boolean));
    } catch {
      // Keep the filter as the URL set it.
    }
  }

  const rows = new Map(); // run id -> {tr, cells, run}
  let latest = [];

  function render(runs) {
    latest = runs;
    const seen = new Set();
    runs.forEach((run, index) => {
      seen.add(run.id);
      let row = rows.get(run.id);
      if (!row) {
        row = createRow(run);
        rows.set(run.id, row);
      }
      updateRow(row, run);
      if (tbody.children[index] !== row.tr) tbody.insertBefore(row.tr, tbody.children[index] || null);
    });
    for (const [id, row] of rows) {
      if (!seen.has(id)) { row.tr.remove(); rows.delete(id); }
    }
    empty.hidden = runs.length > 0;
    table.hidden = runs.length === 0;
    if (!sweepsLoaded && (sweepId || runs.some((r) => r.sweep_id))) loadSweeps();
    const active = runs.filter((r) => !TERMINAL.has(r.status)).length;
    setText(count, `${runs.length}${runs.length === PAGE_SIZE ? "+" : ""} run${runs.length === 1 ? "" : "s"}` +
      (active ? `, ${active} not finished` : "") + (runs.length === PAGE_SIZE ? ` (newest ${PAGE_SIZE} shown)` : ""));
  }

  const query = `/runs?limit=${PAGE_SIZE}` + (status ? `&status=${status}` : "") +
    (sweepId ? `&sweep_id=${encodeURIComponent(sweepId)}` : "");
  const poller = new Poller(async () => {
    const { data, changed } = await getIfChanged(query);
    if (changed) render(data.data);
    else tickClocks();
  }, { intervalMs: ctx.pollMs, onState: ctx.setLive }).start();

  function tickClocks() {
    const now = Date.now();
    for (const run of latest) {
      if (!TERMINAL.has(run.status)) setText(rows.get(run.id).cells.duration, runDuration(run, now));
    }
  }

  return () => { alive = false; poller.stop(); };
}

function columnId(header) {
  return header === "Latest" ? "metric" : header.toLowerCase(); // .col-metric: the latest value
}

function createRow(run) {
  const cells = {
    name: el("td", { class: "col-run" }),
    status: el("td", { class: "col-status" }),
    progress: el("td", { class: "col-progress" }),
    algorithms: el("td", { class: "col-algorithms" }),
    best: el("td", { class: "col-best num", title: "best reported value (highest accuracy, lowest loss)" }),
    metric: el("td", { class: "col-metric num", title: "latest reported value" }),
    restarts: el("td", { class: "col-restarts num" }),
    duration: el("td", { class: "col-duration num" }),
    created: el("td", { class: "col-created" }),
  };
  cells.name.append(el("a", { href: `#/runs/${encodeURIComponent(run.id)}` }, run.name),
    el("div", { class: "muted mono small" }, run.id));
  if (run.sweep_id) {
    cells.name.append(el("a", { class: "sweep-link small", href: `#/sweeps/${encodeURIComponent(run.sweep_id)}`,
                                dataset: { sweepId: run.sweep_id } },
      `trial ${run.trial_id || "?"} of sweep ${run.sweep_id.slice(0, 8)}`));
  }
  cells.status.append(statusBadge(run.status), el("div", { class: "queue-note muted small" }));
  cells.progress.append(progressBar(undefined));
  cells.algorithms.append(algorithmChips(run.spec));
  cells.created.append(formatTime(run.created_at));
  const tr = el("tr", { dataset: { runId: run.id } }, Object.values(cells));
  return { tr, cells };
}

function setMetricCell(cell, metric) {
  const key = metric ? `${metric[0]}=${metric[1]}` : "";
  if (cell.dataset.key === key) return;
  cell.dataset.key = key;
  cell.replaceChildren(...(metric ? [formatNumber(metric[1]), el("span", { class: "metric-key" }, metric[0])] : ["–"]));
}

function updateRow(row, run) {
  row.tr.dataset.status = run.status;
  updateStatusBadge(row.cells.status.firstChild, run.status);
  setText(row.cells.status.lastChild, queueText(run));
  const { fraction, detail } = runProgress(run);
  updateProgressBar(row.cells.progress.firstChild, fraction, detail);
  setMetricCell(row.cells.best, bestMetric(run.best));
  setMetricCell(row.cells.metric, headlineMetric(run.summary));
  const restarts = Math.max(0, run.attempt - 1);
  setText(row.cells.restarts, String(restarts));
  row.cells.restarts.title = `attempt ${run.attempt}`;
  row.cells.restarts.classList.toggle("restarted", restarts > 0);
  setText(row.cells.duration, runDuration(run));
}
