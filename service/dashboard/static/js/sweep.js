// Sweep: status, metric and counts, the Pareto scatter of its trials, a sortable trials
// table, the algorithm sets it skipped (with why), its driver's log, its spec; cancel
// (./confirm.js), archive and delete (./housekeeping.js), shown by the key's role in the
// sweep's own project (access.js scopeRole).
// One conditional GET /sweeps/{id} per poll (ETag), and the log's new bytes; a finished sweep
// polls slower.

import { dump } from "../vendor/js-yaml.mjs";
import { scopeRole } from "./access.js";
import { ApiError, getIfChanged, postJSON, Poller } from "./api.js";
import { confirmDialog } from "./confirm.js";
import { Housekeeping } from "./housekeeping.js";
import { LogPane } from "./logs.js";
import { ParetoChart } from "./pareto.js";
import { bestTrial, trialCounts } from "./sweeps.js";
import {
  algorithmChips, el, errorBox, errorDetails, formatNumber, formatSeconds, formatTime, progressBar, runSpan,
  setText, queueText, statusBadge, STATUSES, TERMINAL, updateStatusBadge,
} from "./ui.js";

const FINISHED_SLOWDOWN = 5;

// The trials table: header, how a trial sorts by it, and whether it is a number (right-aligned).
const COLUMNS = [
  { id: "trial", title: "Trial", sort: (t) => t.trial_id },
  { id: "status", title: "Status", sort: (t) => STATUSES.indexOf(t.status) },
  { id: "algorithms", title: "Algorithms", sort: (t) => t.algorithms.join(" + ") },
  { id: "params", title: "Params", sort: (t) => paramsText(t.params) },
  { id: "metric", title: "Metric", sort: (t) => t.metric, numeric: true },
  { id: "wall", title: "Wall time", sort: (t) => t.wall_time_s, numeric: true,
    hint: "the time the trial trained, its waits between attempts left out" },
  { id: "progress", title: "Progress", sort: (t) => trialProgress(t), numeric: true },
];

function trialProgress(trial) {
  return trial.status === "COMPLETED" ? 1 : trial.progress;
}

function paramsText(params = {}) {
  return Object.keys(params).sort().map((k) => `${k}=${formatValue(params[k])}`).join(", ");
}

function formatValue(value) {
  return typeof value === "number" ? formatNumber(value) : JSON.stringify(value);
}

/** Ascending by `key`; missing values (null, undefined) last whichever the direction. */
function compareBy(key, direction) {
  return (a, b) => {
    const x = key(a);
    const y = key(b);
    const xMissing = x === null || x === undefined;
    const yMissing = y === null || y === undefined;
    if (xMissing || yMissing) return xMissing - yMissing;
    const order = typeof x === "number" && typeof y === "number" ? x - y : String(x).localeCompare(String(y));
    return direction === "descending" ? -order : order;
  };
}

export function mount(root, ctx) {
  const [sweepId] = ctx.params;
  const path = `/sweeps/${encodeURIComponent(sweepId)}`;
  const pareto = new ParetoChart();
  const logPane = new LogPane(path, "sweep-log");
  let lastSweep = null;
  let sortState = null; // {column, direction}; null: the API's order

  // --- layout -------------------------------------------------------------------------
  const title = el("h1", {}, "Sweep ", el("span", { class: "mono" }, sweepId));
  const badgeSlot = el("span", {}, statusBadge("QUEUED"));
  badgeSlot.hidden = true;
  const facts = el("dl", { class: "sweep-facts" });
  const errorSlot = el("div");
  const housekeeping = new Housekeeping({
    kind: "sweep", path,
    onChanged: (sweep) => { render(sweep); poller.poke(); },
    onDeleted: () => { poller.stop(); window.location.hash = "#/sweeps"; },
  });
  const cancel = confirmDialog({
    id: "cancel-sweep-dialog", title: "Cancel this sweep?", keep: "Keep running", confirm: "Cancel sweep",
    confirmId: "confirm-cancel-sweep",
    onConfirm: async () => { render(await postJSON(`${path}/cancel`, undefined)); poller.poke(); },
    onError: (message) => housekeeping.showProblem(`Could not cancel the sweep: ${message}`),
  });
  const cancelButton = el("button", { type: "button", class: "danger", id: "cancel-sweep", hidden: true,
                                      "data-needs": "member", onclick: () => cancel.open(cancelMessage(lastSweep)) },
  "Cancel sweep…");

  const sortButtons = new Map();
  const headerCells = COLUMNS.map((column) => {
    const button = el("button", { type: "button", class: "sort", dataset: { sort: column.id },
                                  onclick: () => sortBy(column) }, column.title,
    el("span", { class: "sort-mark", "aria-hidden": "true" }, ""));
    sortButtons.set(column.id, button);
    return el("th", { scope: "col", class: `col-${column.id}${column.numeric ? " num" : ""}`,
                      ...(column.hint ? { title: column.hint } : {}) }, button);
  });
  const trialsBody = el("tbody");
  const trialsTable = el("table", { class: "runs-table trials-table", id: "trials-table" },
    el("caption", { class: "visually-hidden" }, "Trials; the column buttons sort the table"),
    el("thead", {}, el("tr", {}, headerCells)), trialsBody);
  const trialsEmpty = el("p", { class: "empty", id: "trials-empty" });
  const trialsHeading = el("h2", { id: "trials-h" }, "Trials");
  const skipped = el("div", { id: "skipped" });
  const specBlock = el("pre", { class: "spec mono" });
  const runsLink = el("a", { href: `#/runs?sweep_id=${encodeURIComponent(sweepId)}`, id: "sweep-runs-link" },
    "Its runs in the runs table");

  root.append(
    el("p", { class: "crumbs" }, el("a", { href: "#/sweeps" }, "← Sweeps")),
    el("div", { class: "page-head" }, title, badgeSlot,
      el("div", { class: "actions" }, runsLink, ...housekeeping.buttons, cancelButton)),
    housekeeping.problem,
    el("section", { class: "run-overview", "aria-label": "overview" }, facts),
    errorSlot,
    el("section", { "aria-labelledby": "pareto-h" }, el("h2", { id: "pareto-h" }, "Metric vs wall time"), pareto.element),
    el("section", { "aria-labelledby": "trials-h" }, trialsHeading,
      el("div", { class: "table-wrap" }, trialsTable), trialsEmpty),
    el("section", { "aria-labelledby": "skipped-h" }, el("h2", { id: "skipped-h" }, "Skipped algorithm sets"), skipped),
    el("section", { "aria-labelledby": "sweep-log-h" },
      el("h2", { id: "sweep-log-h" }, "Driver log"),
      el("p", { class: "muted" }, "The Ray Tune driver's output, with every trial's."), logPane.element),
    el("section", { "aria-labelledby": "sweep-spec-h" },
      el("details", {}, el("summary", {}, el("h2", { id: "sweep-spec-h" }, "Spec")), specBlock)),
    cancel.dialog,
    housekeeping.dialog,
  );

  // --- rendering ----------------------------------------------------------------------
  function render(sweep) {
    const first = lastSweep === null;
    lastSweep = sweep;
    scopeRole(root, sweep.project);
    document.title = `${sweep.name} · sweep · Tessera`;
    title.replaceChildren(sweep.name, " ", el("span", { class: "muted mono small" }, sweep.id));
    badgeSlot.hidden = false;
    updateStatusBadge(badgeSlot.firstChild, sweep.status);
    cancelButton.hidden = TERMINAL.has(sweep.status) || sweep.status === "CANCELING";
    housekeeping.render(sweep);
    renderFacts(sweep);
    errorSlot.replaceChildren(...[
      sweep.error ? errorDetails(sweep.error) : null,
      sweep.message ? el("p", { class: "muted", id: "sweep-message" }, sweep.message) : null,
      sweep.queue ? el("p", { class: "muted queue-note", id: "sweep-queue" }, queueText(sweep)) : null,
    ].filter(Boolean));
    pareto.update(sweep);
    renderTrials();
    renderSkipped(sweep.skipped);
    if (first) specBlock.textContent = dump(sweep.spec);
  }

  function renderFacts(sweep) {
    const { done, total } = trialCounts(sweep);
    const best = bestTrial(sweep);
    const counts = Object.entries(sweep.counts || {}).filter(([, n]) => n > 0);
    facts.replaceChildren(...[
      ["Metric", `${sweep.metric} (${sweep.mode}: ${sweep.mode === "max" ? "higher" : "lower"} is better)`],
      ["Trials", `${done}/${total} done`],
      ["By status", counts.length
        ? el("ul", { class: "counts" }, counts.map(([status, n]) => el("li", {}, `${n} `, statusBadge(status))))
        : "–"],
      ["Best", best ? el("span", {}, el("a", { href: `#/runs/${encodeURIComponent(best.run_id)}` }, best.name),
        ` ${formatNumber(best.metric)}`) : "–"],
      ["Scheduler", sweep.spec?.scheduler?.name || "fifo"],
      ["Driver", `${sweep.driver}${sweep.attempt > 1 ? `, attempt ${sweep.attempt}` : ""}`],
      ["Created", formatTime(sweep.created_at)],
      ["Started", formatTime(sweep.started_at)],
      ["Finished", formatTime(sweep.finished_at)],
      ["Duration", runSpan(sweep)],
      housekeeping.fact(sweep),
    ].filter(Boolean).map(([k, v]) => el("div", {}, el("dt", {}, k), el("dd", { dataset: { fact: k.toLowerCase().replace(" ", "-") } }, v))));
  }

  function sortBy(column) {
    const direction = sortState?.column === column && sortState.direction === "ascending" ? "descending" : "ascending";
    sortState = { column, direction };
    renderTrials();
  }

  function renderTrials() {
    if (!lastSweep) return;
    const sweep = lastSweep;
    const trials = [...sweep.trials];
    if (sortState) trials.sort(compareBy(sortState.column.sort, sortState.direction));
    for (const [id, button] of sortButtons) {
      const active = sortState?.column.id === id;
      const th = button.parentElement;
      if (active) th.setAttribute("aria-sort", sortState.direction);
      else th.removeAttribute("aria-sort");
      setText(button.querySelector(".sort-mark"), active ? (sortState.direction === "ascending" ? " ▲" : " ▼") : " ↕");
    }
    setText(trialsHeading, `Trials (${sweep.trials.length})`);
    trialsEmpty.hidden = trials.length > 0;
    if (!trials.length) trialsEmpty.replaceChildren(...noTrialsText(sweep));
    trialsTable.hidden = trials.length === 0;
    const frontier = new Set(sweep.pareto);
    trialsBody.replaceChildren(...trials.map((t) => trialRow(t, sweep, frontier)));
  }

  function renderSkipped(list) {
    if (!list.length) {
      skipped.replaceChildren(el("p", { class: "muted" }, "None: every algorithm set of the search is valid."));
      return;
    }
    skipped.replaceChildren(el("ul", { class: "skipped-list" }, list.map((s) => el("li", {},
      s.algorithms.length ? algorithmChips(s.algorithms) : el("span", { class: "muted" }, "no algorithms"),
      el("span", { class: "skip-reason" }, s.reason)))));
  }

  // --- polling ------------------------------------------------------------------------
  const poller = new Poller(async () => {
    let sweep;
    try {
      const answer = await getIfChanged(path);
      sweep = answer.data;
      if (answer.changed || !lastSweep) render(sweep);
      else setText(facts.querySelector('[data-fact="duration"]'), runSpan(sweep));
    } catch (error) {
      if (error instanceof ApiError && error.status === 404) {
        root.replaceChildren(el("h1", {}, "Sweep not found"), errorBox(`No sweep with id ${sweepId}.`),
          el("p", {}, el("a", { href: "#/sweeps" }, "Back to the sweeps")));
      }
      throw error;
    }
    if (sweep.driver === "external") {
      logPane.elsewhere("This sweep's driver runs outside Tessera (driver: external): its output, with " +
        "every trial's, is wherever that driver runs.");
    } else {
      await logPane.poll(sweep);
    }
    return TERMINAL.has(sweep.status) ? ctx.pollMs * FINISHED_SLOWDOWN : ctx.pollMs;
  }, { intervalMs: ctx.pollMs, onState: ctx.setLive }).start();

  return () => {
    poller.stop();
    pareto.destroy();
    delete root.dataset.projectRole;
    cancel.close();
    housekeeping.close();
  };
}

function cancelMessage(sweep) {
  return `“${sweep.name}” is ${sweep.status}. Its driver stops and every trial still running ends as CANCELED. ` +
    "This cannot be undone.";
}

/** Why the trials table is empty: none started yet, or the sweep ended (or is ending) without one, and its error. */
function noTrialsText(sweep) {
  if (!TERMINAL.has(sweep.status) && sweep.status !== "CANCELING") {
    return ["No trials yet: the driver registers each one as it starts."];
  }
  const error = sweep.error ? sweep.error.trim().split("\n").pop().slice(0, 300) : "";
  return [sweep.status === "CANCELING" ? "This sweep is being canceled; no trial started."
    : `This sweep ended ${sweep.status} with no trial: none started.`,
    error ? el("span", { class: "trials-empty-error" }, " Its error: ", el("code", {}, error), " (in full above).") : null,
  ].filter(Boolean);
}

function trialRow(trial, sweep, frontier) {
  const tags = [
    frontier.has(trial.run_id) ? el("span", { class: "tag tag-frontier" }, "frontier") : null,
    trial.run_id === sweep.best_run_id ? el("span", { class: "tag" }, "best") : null,
    trial.attempt > 1 ? el("span", { class: "tag tag-muted" }, `${trial.attempt - 1} restart${trial.attempt > 2 ? "s" : ""}`) : null,
  ].filter(Boolean);
  const params = Object.keys(trial.params || {}).sort();
  return el("tr", { dataset: { runId: trial.run_id, trialId: trial.trial_id, status: trial.status } },
    el("td", { class: "col-trial" },
      el("a", { href: `#/runs/${encodeURIComponent(trial.run_id)}` }, trial.name),
      el("div", { class: "muted mono small" }, trial.trial_id), tags.length ? el("div", { class: "tags" }, tags) : null),
    el("td", { class: "col-status" }, statusBadge(trial.status)),
    el("td", { class: "col-algorithms" }, algorithmChips(trial.algorithms)),
    el("td", { class: "col-params small" }, params.length
      ? el("ul", { class: "params-list" }, params.map((k) => el("li", {}, el("span", { class: "mono" }, k), ` = ${formatValue(trial.params[k])}`)))
      : el("span", { class: "muted" }, "–")),
    el("td", { class: "col-metric num", dataset: { value: trial.metric ?? "" } }, formatNumber(trial.metric)),
    el("td", { class: "col-wall num", dataset: { value: trial.wall_time_s ?? "" } }, formatSeconds(trial.wall_time_s)),
    el("td", { class: "col-progress" }, progressBar(trialProgress(trial))));
}
