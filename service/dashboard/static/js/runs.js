// Runs: the table a researcher keeps open. One conditional GET /runs per poll (ETag: a 304
// changes nothing but the running clocks); rows are keyed by run id and updated in place.
// "Show older runs" pages on with the API's cursor, and the older pages stay live too
// (./paging.js says how).
// Filters live in the URL (`#/runs?status=FAILED&sweep_id=...&tag=...&name=...&archived=true`), so a filtered
// view can be linked. Ticking 2–8 rows enables "Compare", which opens `#/compare?ids=...`.

import { getJSON, Poller } from "./api.js";
import { olderButton, PagedList, shownCount } from "./paging.js";
import {
  algorithmChips, archivedFilter, archivedOf, listHash, bestMetric, el, formatNumber, formatTime, headlineMetric, progressBar, runProgress,
  queueText, setText, spanNote, statusBadge, STATUSES, TERMINAL, trainedDuration, trainedTitle, updateProgressBar,
  updateStatusBadge,
} from "./ui.js";

const PAGE_SIZE = 100;
const COLUMNS = ["Select", "Run", "Status", "Progress", "Algorithms", "Best", "Latest", "Attempt", "Duration", "Created"];
const COLUMN_TITLES = { Duration: "time trained, waits between attempts left out (a row's tooltip gives the " +
  "wall-clock span where it differs)" };

function runsHash({ status, sweepId, tag, name, archived }) {
  return listHash("runs", { status, archived, sweep_id: sweepId, tag, name });
}

export function mount(root, ctx) {
  let alive = true;
  const status = STATUSES.includes(ctx.query.get("status")) ? ctx.query.get("status") : "";
  const sweepId = ctx.query.get("sweep_id") || "";
  const tag = ctx.query.get("tag") || "";
  const name = ctx.query.get("name") || "";
  const archived = archivedOf(ctx.query);
  const filters = { status, sweepId, tag, name, archived };
  const archivedSelect = archivedFilter("archived-filter", archived, (value) => {
    window.location.hash = runsHash({ ...filters, archived: value });
  });
  const filter = el("select", { id: "status-filter", onchange: (e) => {
    window.location.hash = runsHash({ ...filters, status: e.target.value });
  } },
  el("option", { value: "" }, "all statuses"),
  STATUSES.map((s) => el("option", { value: s, selected: s === status }, s)));
  const sweepFilter = el("select", { id: "sweep-filter", onchange: (e) => {
    window.location.hash = runsHash({ ...filters, sweepId: e.target.value });
  } },
  el("option", { value: "" }, "all runs"),
  sweepId ? el("option", { value: sweepId, selected: true }, sweepId) : null);
  // Shown once a run of a sweep is listed (or the URL filters by one); its choices load then.
  const sweepFilterBox = el("span", { class: "sweep-filter-box", hidden: !sweepId },
    el("label", { for: "sweep-filter" }, "Sweep "), sweepFilter);
  const sweepNote = el("p", { id: "sweep-note", hidden: !sweepId },
    "Trials of sweep ", el("a", { href: `#/sweeps/${encodeURIComponent(sweepId)}` }, sweepId),
    " · ", el("a", { href: runsHash({ status, archived }) }, "show all runs"));
  const count = el("p", { class: "muted", id: "runs-count", "aria-live": "polite" });
  const tbody = el("tbody");
  const query = `/runs?limit=${PAGE_SIZE}` + (status ? `&status=${status}` : "") +
    (sweepId ? `&sweep_id=${encodeURIComponent(sweepId)}` : "") + (tag ? `&tag=${encodeURIComponent(tag)}` : "") +
    (name ? `&name=${encodeURIComponent(name)}` : "") + (archived !== "false" ? `&archived=${archived}` : "");
  const list = new PagedList(query);
  const older = olderButton(list, { id: "runs-older", label: "Show older runs", noun: "runs", rows: tbody, render });
  const table = el("table", { class: "runs-table", id: "runs-table" },
    el("caption", { class: "visually-hidden" }, "Runs, newest first"),
    el("thead", {}, el("tr", {}, COLUMNS.map((h) => el("th", { scope: "col", class: `col-${columnId(h)}`,
                                                              title: COLUMN_TITLES[h] },
      h === "Select" ? el("span", { class: "visually-hidden" }, "Select to compare") : h)))),
    tbody);
  const nameFilter = el("input", { type: "search", id: "name-filter", value: name, placeholder: "name contains…",
                                   "aria-label": "Search run names", maxlength: "128", onchange: (e) => {
    window.location.hash = runsHash({ ...filters, name: e.target.value.trim() });
  } });
  const tagNote = el("p", { id: "tag-note", hidden: !tag }, "Tagged ", el("span", { class: "chip tag-chip" }, tag),
    " · ", el("a", { href: runsHash({ ...filters, tag: "" }), id: "clear-tag" }, "show every tag"));
  const selected = new Set();
  const compareButton = el("button", { type: "button", id: "compare-runs", disabled: true, onclick: () => {
    window.location.hash = `#/compare?ids=${[...selected].map(encodeURIComponent).join(",")}`;
  } }, "Compare");
  function onSelect(runId, checked) {
    if (checked) selected.add(runId); else selected.delete(runId);
    compareButton.disabled = selected.size < 2 || selected.size > 8;
    setText(compareButton, selected.size ? `Compare ${selected.size}` : "Compare");
    compareButton.title = selected.size > 8 ? "at most 8 runs" : "tick 2 to 8 runs";
  }
  const emptyText = tag || name || archived !== "false" ? "No runs match these filters." : sweepId ? `No ${status ? `${status} ` : ""}trials in this sweep.` : status ? `No ${status} runs.` : null;
  const empty = el("p", { class: "empty", hidden: true },
    emptyText || "No runs yet. ", emptyText ? null : el("a", { href: "#/submit" }, "Submit one."));
  root.append(
    el("div", { class: "page-head" },
      el("h1", {}, "Runs"),
      el("div", { class: "filters" }, nameFilter, sweepFilterBox, el("label", { for: "status-filter" }, "Status "),
        filter, archivedSelect, compareButton)),
    sweepNote,
    tagNote,
    count,
    el("div", { class: "table-wrap" }, table),
    older.element,
    empty,
  );

  // The sweep filter's choices: loaded once (a service without sweeps just keeps "all runs").
  let sweepsLoaded = false;
  async function loadSweeps() {
    sweepsLoaded = true;
    sweepFilterBox.hidden = false;
    try {
      const sweeps = (await getJSON("/sweeps?limit=100&archived=all")).data;  // an archived sweep's trials too
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
  let latest = null; // the runs shown; null until the first answer is rendered

  function render(runs) {
    latest = runs;
    const seen = new Set();
    runs.forEach((run, index) => {
      seen.add(run.id);
      let row = rows.get(run.id);
      if (!row) {
        row = createRow(run, filters, onSelect);
        rows.set(run.id, row);
      }
      updateRow(row, run);
      if (tbody.children[index] !== row.tr) tbody.insertBefore(row.tr, tbody.children[index] || null);
    });
    for (const [id, row] of rows) {
      if (!seen.has(id)) { row.tr.remove(); rows.delete(id); onSelect(id, false); }
    }
    empty.hidden = runs.length > 0;
    table.hidden = runs.length === 0;
    if (!sweepsLoaded && (sweepId || runs.some((r) => r.sweep_id))) loadSweeps();
    setText(count, shownCount(list, "run"));
    older.update();
  }

  const poller = new Poller(async () => {
    // A 304 on the first poll (a list seen before this page was mounted, e.g. before a project switch)
    // still renders: the first poll always counts as a change.
    if (await list.poll()) render(list.items);
    else tickClocks();
  }, { intervalMs: ctx.pollMs, onState: ctx.setLive }).start();

  function tickClocks() {
    const now = Date.now();
    for (const run of latest) {
      if (!TERMINAL.has(run.status)) setDurationCell(rows.get(run.id).cells.duration, run, now);
    }
  }

  return () => { alive = false; poller.stop(); };
}

function columnId(header) {
  return header === "Latest" ? "metric" : header.toLowerCase(); // .col-metric: the latest value
}

/** A run's tags as chips, each a link to the runs with that tag. */
function tagChips(tags, filters) {
  return el("ul", { class: "chips tags", "aria-label": "tags" }, tags.map((t) => el("li", {},
    el("a", { class: "chip tag-chip", href: runsHash({ ...filters, tag: t }) }, t))));
}

function createRow(run, filters, onSelect) {
  const cells = {
    select: el("td", { class: "col-select" }, el("input", { type: "checkbox", class: "select-run",
      "aria-label": `select ${run.name} to compare`, onchange: (e) => onSelect(run.id, e.target.checked) })),
    name: el("td", { class: "col-run" }),
    status: el("td", { class: "col-status" }),
    progress: el("td", { class: "col-progress" }),
    algorithms: el("td", { class: "col-algorithms" }),
    best: el("td", { class: "col-best num", title: "best reported value (highest accuracy, lowest loss)" }),
    metric: el("td", { class: "col-metric num", title: "latest reported value" }),
    attempt: el("td", { class: "col-attempt num" }),
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
  const tags = el("div", { class: "run-tags" });
  cells.name.append(tags);
  cells.status.append(statusBadge(run.status), el("div", { class: "queue-note muted small" }));
  cells.progress.append(progressBar(undefined));
  cells.algorithms.append(algorithmChips(run.spec));
  cells.created.append(formatTime(run.created_at));
  const tr = el("tr", { dataset: { runId: run.id } }, Object.values(cells));
  return { tr, cells, tags, filters };
}

function setMetricCell(cell, metric) {
  const key = metric ? `${metric[0]}=${metric[1]}` : "";
  if (cell.dataset.key === key) return;
  cell.dataset.key = key;
  cell.replaceChildren(...(metric ? [formatNumber(metric[1]), el("span", { class: "metric-key" }, metric[0])] : ["–"]));
}

function updateRow(row, run) {
  row.tr.dataset.status = run.status;
  const tagKey = (run.tags || []).join(" ");
  if (row.tags.dataset.tags !== tagKey) {
    row.tags.dataset.tags = tagKey;
    row.tags.replaceChildren(...(run.tags?.length ? [tagChips(run.tags, row.filters)] : []));
  }
  updateStatusBadge(row.cells.status.firstChild, run.status);
  setText(row.cells.status.lastChild, queueText(run));
  const { fraction, detail } = runProgress(run);
  updateProgressBar(row.cells.progress.firstChild, fraction, detail);
  setMetricCell(row.cells.best, bestMetric(run.best));
  setMetricCell(row.cells.metric, headlineMetric(run.summary));
  // The attempt, not "restarts": a user's resume or continue starts one too, and the run's page
  // counts restarts and re-queues apart (a resumed run read "1 restart" here, "0 restarts" there).
  setText(row.cells.attempt, String(run.attempt));
  row.cells.attempt.title = run.attempt > 1
    ? `attempt ${run.attempt}: each attempt after the first is a worker-group restart, a re-queue or a resume `
      + "(the run's events say which)"
    : "the first attempt";
  row.cells.attempt.classList.toggle("restarted", run.attempt > 1);
  setDurationCell(row.cells.duration, run);
}

/** The time the run trained (its waits between attempts left out); its tooltip says so, and gives
 *  the wall-clock span where that reads otherwise. */
function setDurationCell(cell, run, now = Date.now()) {
  setText(cell, trainedDuration(run, now));
  const span = spanNote(run, now);
  const title = [trainedTitle(run), span].filter(Boolean).join("; ");
  if ((cell.title || "") !== title) cell.title = title;
}
