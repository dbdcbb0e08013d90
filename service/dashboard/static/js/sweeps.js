// Sweeps: every sweep, newest first (one conditional GET /sweeps per poll; "Show older sweeps"
// pages on with the API's cursor, ./paging.js), filtered by name and archive state in the URL
// (`#/sweeps?name=...&archived=all`), and the numbers the sweep pages share: how many trials
// are done out of how many, and the best so far.

import { Poller } from "./api.js";
import { olderButton, PagedList, shownCount } from "./paging.js";
import {
  archivedFilter, archivedOf, listHash, el, formatNumber, formatTime, queueText, runSpan, setText, statusBadge, TERMINAL,
  updateStatusBadge,
} from "./ui.js";

const PAGE_SIZE = 100;

function sweepsHash({ name, archived }) {
  return listHash("sweeps", { name, archived });
}

/** How many trials the search asks for: valid algorithm sets × grid points × num_samples
 *  (null when the spec is not readable). ASHA-stopped trials count as done. */
export function expectedTrials(sweep) {
  const search = sweep.spec?.search;
  if (!search) return null;
  let sets = 1;
  const algorithms = search.algorithms;
  if (algorithms?.sets) sets = algorithms.sets.length;
  else if (algorithms?.pool) {
    const n = algorithms.pool.length;
    const maxSize = algorithms.max_size ?? n;
    sets = 0;
    for (let k = 0; k <= Math.min(maxSize, n); k += 1) sets += binomial(n, k);
  }
  if (algorithms) sets -= (sweep.skipped || []).length;
  const grid = Object.values(search.params || {}).reduce((product, d) => product * (d.grid ? d.grid.length : 1), 1);
  return Math.max(0, sets) * grid * (sweep.spec.num_samples || 1);
}

function binomial(n, k) {
  let value = 1;
  for (let i = 1; i <= k; i += 1) value = (value * (n - k + i)) / i;
  return Math.round(value);
}

/** `{done, total}`: finished trials (any end) out of the search's size, or of those seen if larger. */
export function trialCounts(sweep) {
  const done = sweep.trials.filter((t) => TERMINAL.has(t.status)).length;
  const expected = expectedTrials(sweep);
  return { done, total: Math.max(expected ?? 0, sweep.trials.length) };
}

/** The best trial: `best_run_id` (COMPLETED trials), else the best metric of any trial so far. */
export function bestTrial(sweep) {
  const byId = sweep.trials.find((t) => t.run_id === sweep.best_run_id);
  if (byId) return byId;
  const scored = sweep.trials.filter((t) => typeof t.metric === "number");
  if (!scored.length) return null;
  return scored.reduce((a, b) => ((sweep.mode === "min" ? b.metric < a.metric : b.metric > a.metric) ? b : a));
}

export function mount(root, ctx) {
  const name = ctx.query.get("name") || "";
  const archived = archivedOf(ctx.query);
  const filters = { name, archived };
  const count = el("p", { class: "muted", id: "sweeps-count", "aria-live": "polite" });
  const tbody = el("tbody");
  const list = new PagedList(`/sweeps?limit=${PAGE_SIZE}&archived=${archived}` +
    (name ? `&name=${encodeURIComponent(name)}` : ""));
  const older = olderButton(list, { id: "sweeps-older", label: "Show older sweeps", noun: "sweeps", rows: tbody,
    render });
  const table = el("table", { class: "runs-table sweeps-table", id: "sweeps-table" },
    el("caption", { class: "visually-hidden" }, "Sweeps, newest first"),
    el("thead", {}, el("tr", {}, ["Sweep", "Status", "Trials done", "Best", "Started", "Duration"]
      .map((h) => el("th", { scope: "col", class: `col-${h.split(" ")[0].toLowerCase()}` }, h)))),
    tbody);
  const empty = el("p", { class: "empty", id: "sweeps-empty", hidden: true }, "No sweeps yet. Submit one with ",
    el("code", {}, "tessera sweeps submit examples/digits_sweep.yaml"), " (an example SweepSpec to start from), " +
    "or from code with ",
    el("code", {}, "POST /api/v1/sweeps"), " or ", el("code", {}, "workers.tune.run_sweep"), "; see ",
    el("code", {}, "docs/sweeps.md"), " in the repository.");
  if (name || archived !== "false") empty.replaceChildren("No sweeps match these filters.");
  const archivedSelect = archivedFilter("sweeps-archived-filter", archived, (value) => {
    window.location.hash = sweepsHash({ ...filters, archived: value });
  });
  const nameFilter = el("input", { type: "search", id: "sweeps-name-filter", value: name, placeholder: "name contains…",
                                   "aria-label": "Search sweep names", maxlength: "128", onchange: (e) => {
    window.location.hash = sweepsHash({ ...filters, name: e.target.value.trim() });
  } });
  root.append(
    el("div", { class: "page-head" }, el("h1", {}, "Sweeps"),
      el("div", { class: "filters" }, nameFilter, archivedSelect)),
    count,
    el("div", { class: "table-wrap" }, table),
    older.element,
    empty,
  );

  const rows = new Map(); // sweep id -> {tr, cells}
  let latest = null; // the sweeps shown; null until the first answer is rendered

  function render(sweeps) {
    latest = sweeps;
    const seen = new Set();
    sweeps.forEach((sweep, index) => {
      seen.add(sweep.id);
      let row = rows.get(sweep.id);
      if (!row) rows.set(sweep.id, (row = createRow(sweep)));
      updateRow(row, sweep);
      if (tbody.children[index] !== row.tr) tbody.insertBefore(row.tr, tbody.children[index] || null);
    });
    for (const [id, row] of rows) {
      if (!seen.has(id)) { row.tr.remove(); rows.delete(id); }
    }
    empty.hidden = sweeps.length > 0;
    table.hidden = sweeps.length === 0;
    setText(count, shownCount(list, "sweep"));
    older.update();
  }

  const poller = new Poller(async () => {
    // A 304 on the first poll (a list seen before this page was mounted, e.g. before a project switch)
    // still renders: the first poll always counts as a change.
    if (await list.poll()) render(list.items);
    else {
      const now = Date.now();
      for (const sweep of latest) {
        if (!TERMINAL.has(sweep.status)) setText(rows.get(sweep.id).cells.duration, runSpan(sweep, now));
      }
    }
  }, { intervalMs: ctx.pollMs, onState: ctx.setLive }).start();

  return () => poller.stop();
}

function createRow(sweep) {
  const cells = {
    name: el("td", { class: "col-sweep" }),
    status: el("td", { class: "col-status" }),
    trials: el("td", { class: "col-trials num" }),
    best: el("td", { class: "col-best num" }),
    started: el("td", { class: "col-started" }),
    duration: el("td", { class: "col-duration num" }),
  };
  cells.name.append(el("a", { href: `#/sweeps/${encodeURIComponent(sweep.id)}` }, sweep.name),
    el("div", { class: "muted mono small" }, sweep.id));
  cells.status.append(statusBadge(sweep.status), el("div", { class: "queue-note muted small" }));
  return { tr: el("tr", { dataset: { sweepId: sweep.id } }, Object.values(cells)), cells };
}

function updateRow(row, sweep) {
  row.tr.dataset.status = sweep.status;
  updateStatusBadge(row.cells.status.firstChild, sweep.status);
  setText(row.cells.status.lastChild, queueText(sweep));
  const { done, total } = trialCounts(sweep);
  setText(row.cells.trials, `${done}/${total}`);
  const best = bestTrial(sweep);
  row.cells.best.replaceChildren(...(best
    ? [formatNumber(best.metric), el("span", { class: "metric-key" }, `${sweep.metric} (${sweep.mode})`)]
    : ["–"]));
  setText(row.cells.started, formatTime(sweep.started_at));
  setText(row.cells.duration, runSpan(sweep));
}
