// Runs: the table a researcher keeps open. One conditional GET /runs per poll (ETag: a 304
// changes nothing but the running clocks); rows are keyed by run id and updated in place.

import { getIfChanged, Poller } from "./api.js";
import {
  algorithmChips, el, formatNumber, formatTime, headlineMetric, progressBar, runDuration, runProgress,
  setText, statusBadge, STATUSES, TERMINAL, updateProgressBar, updateStatusBadge,
} from "./ui.js";

const PAGE_SIZE = 100;

export function mount(root, ctx) {
  const status = STATUSES.includes(ctx.query.get("status")) ? ctx.query.get("status") : "";
  const filter = el("select", { id: "status-filter", onchange: (e) => {
    window.location.hash = e.target.value ? `#/runs?status=${e.target.value}` : "#/runs";
  } },
  el("option", { value: "" }, "all statuses"),
  STATUSES.map((s) => el("option", { value: s, selected: s === status }, s)));
  const count = el("p", { class: "muted", id: "runs-count", "aria-live": "polite" });
  const tbody = el("tbody");
  const table = el("table", { class: "runs-table", id: "runs-table" },
    el("caption", { class: "visually-hidden" }, "Runs, newest first"),
    el("thead", {}, el("tr", {},
      ["Run", "Status", "Progress", "Algorithms", "Metric", "Attempt", "Duration", "Created"]
        .map((h) => el("th", { scope: "col", class: `col-${h.toLowerCase()}` }, h)))),
    tbody);
  const empty = el("p", { class: "empty", hidden: true },
    status ? `No ${status} runs.` : "No runs yet. ", status ? null : el("a", { href: "#/submit" }, "Submit one."));
  root.append(
    el("div", { class: "page-head" },
      el("h1", {}, "Runs"),
      el("div", { class: "filters" }, el("label", { for: "status-filter" }, "Status "), filter)),
    count,
    el("div", { class: "table-wrap" }, table),
    empty,
  );

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
    const active = runs.filter((r) => !TERMINAL.has(r.status)).length;
    setText(count, `${runs.length}${runs.length === PAGE_SIZE ? "+" : ""} run${runs.length === 1 ? "" : "s"}` +
      (active ? `, ${active} not finished` : "") + (runs.length === PAGE_SIZE ? ` (newest ${PAGE_SIZE} shown)` : ""));
  }

  const query = `/runs?limit=${PAGE_SIZE}` + (status ? `&status=${status}` : "");
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

  return () => poller.stop();
}

function createRow(run) {
  const cells = {
    name: el("td", { class: "col-run" }),
    status: el("td", { class: "col-status" }),
    progress: el("td", { class: "col-progress" }),
    algorithms: el("td", { class: "col-algorithms" }),
    metric: el("td", { class: "col-metric num", title: "latest reported value" }),
    attempt: el("td", { class: "col-attempt num" }),
    duration: el("td", { class: "col-duration num" }),
    created: el("td", { class: "col-created" }),
  };
  cells.name.append(el("a", { href: `#/runs/${encodeURIComponent(run.id)}` }, run.name),
    el("div", { class: "muted mono small" }, run.id));
  cells.status.append(statusBadge(run.status));
  cells.progress.append(progressBar(undefined));
  cells.algorithms.append(algorithmChips(run.spec));
  cells.created.append(formatTime(run.created_at));
  const tr = el("tr", { dataset: { runId: run.id } }, Object.values(cells));
  return { tr, cells };
}

function updateRow(row, run) {
  row.tr.dataset.status = run.status;
  updateStatusBadge(row.cells.status.firstChild, run.status);
  const { fraction, detail } = runProgress(run);
  updateProgressBar(row.cells.progress.firstChild, fraction, detail);
  const metric = headlineMetric(run.summary);
  const metricKey = metric ? `${metric[0]}=${metric[1]}` : "";
  if (row.cells.metric.dataset.key !== metricKey) {
    row.cells.metric.dataset.key = metricKey;
    row.cells.metric.replaceChildren(...(metric
      ? [formatNumber(metric[1]), el("span", { class: "metric-key" }, metric[0])]
      : ["–"]));
  }
  setText(row.cells.attempt, String(run.attempt));
  setText(row.cells.duration, runDuration(run));
}
