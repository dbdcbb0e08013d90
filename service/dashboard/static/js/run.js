// Run: status, progress, live charts, the events timeline, the spec; cancel and resume
// (./run_actions.js); archive and delete (./housekeeping.js); lineage (parent, forks) with fork
// and continue (./lineage.js). A sweep trial links to its sweep. The actions are shown by the
// key's role in the run's own project (access.js scopeRole).
//
// Per poll: one conditional GET /runs/{id} (ETag) and one GET /runs/{id}/metrics?after=CURSOR
// (only new points; more pages only while catching up). Events change only with the status,
// so they are fetched when status or attempt changed, and otherwise every 5th poll (a
// RUNNING -> RESTARTING -> RUNNING blip can fall between two polls); checkpoints likewise.

import { dump } from "../vendor/js-yaml.mjs";
import { scopeRole } from "./access.js";
import { ApiError, downloadFile, errorText, getIfChanged, getJSON, postJSON, Poller } from "./api.js";
import { ChartGrid } from "./charts.js";
import { Housekeeping } from "./housekeeping.js";
import { continueDialog, forkDialog, parentFact, renderChildren } from "./lineage.js";
import { LogPane } from "./logs.js";
import { cancelDialog, cancelViaSweep, resumeDialog } from "./run_actions.js";
import { RunNotes } from "./run_notes.js";
import {
  algorithmChips, DRAFT_KEY, el, errorBox, errorDetails, formatBytes, formatNumber, formatTime, progressBar,
  RESUMABLE, queueText, renderDurationFact, runProgress, setText, statusBadge, TERMINAL, updateProgressBar,
  updateStatusBadge,
} from "./ui.js";

const METRICS_PAGE = 10_000;
const MAX_PAGES_PER_POLL = 10;
const EVENTS_EVERY = 5;
const FINISHED_SLOWDOWN = 5; // a finished run may still get a late metrics flush; poll it slower
// A FAILED run's error that blames the machine or Ray, not the code: another attempt may well
// pass. Besides Ray's own words, the service's (service/job_follower.py, service/job_kinds.py):
// a job Ray never created, one that ended without a result, restarts given up on. Read only
// where the run has no `failure` (api/views.py RunView.failure): it failed before the service
// recorded one, its worker is older than that field, or neither the worker nor the dispatcher
// knew (a job that failed without its worker's word: its log tail is all there is).
const MACHINE_FAILURE = new RegExp([
  String.raw`preempt`, String.raw`\bnode\b[^\n]{0,60}\b(died|dead|lost|terminated)\b`, "NodeDied", "ActorDied",
  "Ray did not create job", "ended without reporting a result", "; giving up",
].join("|"), "i");

export function mount(root, ctx) {
  const [runId] = ctx.params;
  const path = `/runs/${encodeURIComponent(runId)}`;
  const charts = new ChartGrid();
  const logPane = new LogPane(path);
  const notes = new RunNotes(path, () => poller.poke());
  let cursor = 0;
  let polls = 0;
  let lastRun = null;
  let eventsDue = true;

  // --- layout -------------------------------------------------------------------------
  const title = el("h1", {}, "Run ", el("span", { class: "mono" }, runId));
  const badgeSlot = el("span", {}, statusBadge("QUEUED"));
  badgeSlot.hidden = true;
  const progress = progressBar(undefined);
  const facts = el("dl", { class: "facts" });
  const errorSlot = el("div", { id: "run-error" });
  const housekeeping = new Housekeeping({
    kind: "run", path,
    onChanged: (run) => { render(run); poller.poke(); },
    onDeleted: () => { poller.stop(); window.location.hash = "#/runs"; },
  });
  const cancel = cancelDialog(path, (run) => {
    render(run);
    eventsDue = true; // the CANCELING event, even if the next poll still reads CANCELING
    poller.poke();
  }, (message) => housekeeping.showProblem(message));
  const cancelButton = el("button", { type: "button", class: "danger", id: "cancel-run", hidden: true, "data-needs": "member",
                                      onclick: () => cancel.open(cancelMessage(lastRun)) }, "Cancel run…");
  const viaSweep = cancelViaSweep(); // for a trial its sweep drives, instead of the cancel button
  const resubmit = el("button", { type: "button", id: "edit-resubmit", hidden: true, "data-needs": "member", onclick: () => {
    sessionStorage.setItem(DRAFT_KEY, dump(lastRun.spec));
    window.location.hash = "#/submit";
  } }, "Edit & resubmit");
  const resume = resumeDialog(path, (run) => {
    render(run);
    eventsDue = true; // the new attempt's QUEUED event
    poller.poke();
  });
  const resumeButton = el("button", { type: "button", class: "primary", id: "resume-run", hidden: true, "data-needs": "member",
                                      onclick: () => resume.open(lastRun) }, "Resume…");
  let lastCheckpoints = [];
  const fork = forkDialog(path);
  const forkButton = el("button", { type: "button", id: "fork-run", hidden: true, "data-needs": "member",
                                    onclick: () => fork.open(lastRun, lastCheckpoints) }, "Fork…");
  const continuation = continueDialog(path, (run) => {
    render(run);
    eventsDue = true;
    poller.poke();
  });
  const continueButton = el("button", { type: "button", id: "continue-run", hidden: true, "data-needs": "member",
                                        onclick: () => continuation.open(lastRun) }, "Continue…");
  const children = el("div", { id: "children" }, el("p", { class: "muted" }, "Loading…"));
  const crumbs = el("p", { class: "crumbs" }, el("a", { href: "#/runs" }, "← Runs"));
  const summaryTable = el("tbody");
  const events = el("ol", { class: "timeline", id: "events" });
  const restarts = el("span", { class: "muted" });
  const specBlock = el("pre", { class: "spec mono" });
  const checkpoints = el("div", { id: "checkpoints" }, el("p", { class: "muted" }, "Loading…"));

  root.append(
    crumbs,
    el("div", { class: "page-head" }, title, badgeSlot,
      el("div", { class: "actions" }, resubmit, forkButton, continueButton, resumeButton, ...housekeeping.buttons,
        cancelButton, viaSweep)),
    housekeeping.problem,
    el("section", { class: "run-overview", "aria-label": "overview" }, progress, facts),
    errorSlot,
    notes.element,
    el("section", { "aria-labelledby": "charts-h" }, el("h2", { id: "charts-h" }, "Metrics"), charts.element),
    el("div", { class: "two-col" },
      el("section", { "aria-labelledby": "events-h" },
        el("h2", { id: "events-h" }, "Events ", restarts), events),
      el("section", { "aria-labelledby": "latest-h" },
        el("h2", { id: "latest-h" }, "Latest values"),
        el("table", { class: "summary-table" },
          el("thead", {}, el("tr", {}, el("th", { scope: "col" }, "metric"), el("th", { scope: "col" }, "value"))),
          summaryTable))),
    el("section", { "aria-labelledby": "checkpoints-h" },
      el("h2", { id: "checkpoints-h" }, "Checkpoints"), checkpoints),
    el("section", { "aria-labelledby": "forks-h" }, el("h2", { id: "forks-h" }, "Forks"), children),
    el("section", { "aria-labelledby": "logs-h" }, el("h2", { id: "logs-h" }, "Logs"), logPane.element),
    el("section", { "aria-labelledby": "spec-h" },
      el("details", { open: true }, el("summary", {}, el("h2", { id: "spec-h" }, "Spec")), specBlock)),
    cancel.dialog,
    housekeeping.dialog,
    resume.dialog,
    fork.dialog,
    continuation.dialog,
  );

  // --- rendering ----------------------------------------------------------------------
  function render(run) {
    const first = lastRun === null;
    lastRun = run;
    scopeRole(root, run.project);
    document.title = `${run.name} · Tessera`;
    title.replaceChildren(run.name, " ", el("span", { class: "muted mono small" }, run.id));
    badgeSlot.hidden = false;
    updateStatusBadge(badgeSlot.firstChild, run.status);
    const { fraction, detail } = runProgress(run);
    updateProgressBar(progress, fraction, detail);
    facts.replaceChildren(...[
      ["Project", run.project || "default"],
      ...(run.queue ? [["Queue", queueText(run)]] : []),
      ["Attempt", String(run.attempt)],
      ["Duration", ""],  // the time trained, and the wall-clock span where it reads otherwise: below
      ["Created", formatTime(run.created_at)],
      ["Started", formatTime(run.started_at)],
      // A later attempt's own start (a resume, a restart): Started is the first attempt's.
      run.attempt > 1 && run.attempt_started_at ? ["Attempt started", formatTime(run.attempt_started_at)] : null,
      ["Finished", formatTime(run.finished_at)],
      ["Algorithms", algorithmChips(run.spec)],
      run.sweep_id ? ["Sweep", sweepLink(run)] : null,
      parentFact(run),
      housekeeping.fact(run),
    ].filter(Boolean).flatMap(([k, v]) => [el("dt", {}, k), el("dd", { dataset: { fact: k.toLowerCase() } }, v)]));
    renderDurationFact(facts.querySelector('[data-fact="duration"]'), run);
    errorSlot.replaceChildren(run.error ? errorDetails(run.error) : "");
    renderCancel();
    housekeeping.render(run);
    resumeButton.hidden = !RESUMABLE.has(run.status);
    // The highlight says "do this next": true of a canceled or stopped run, and of a failure of
    // the machine (a lost node, a preemption); an error in the code or spec would only fail again.
    const retryable = run.status !== "FAILED" ||
      (run.failure ? run.failure === "machine" : MACHINE_FAILURE.test(run.error || ""));
    resumeButton.classList.toggle("primary", retryable);
    resumeButton.title = retryable ? "" : "Read the error first: a resume of a run that failed in its code fails again.";
    forkButton.hidden = false;
    continueButton.hidden = run.status !== "COMPLETED";
    if (run.sweep_id && crumbs.childElementCount === 1) {
      crumbs.append(" · ", el("a", { href: `#/sweeps/${encodeURIComponent(run.sweep_id)}`, id: "run-sweep-crumb" },
        "← its sweep"));
    }
    resubmit.hidden = false;
    summaryTable.replaceChildren(...Object.keys(run.summary).sort().map((key) =>
      el("tr", {}, el("td", { class: "mono" }, key), el("td", { class: "num" }, formatNumber(run.summary[key])))));
    if (first) specBlock.textContent = dump(run.spec);
    charts.describe(run.spec, TERMINAL.has(run.status));
    notes.render(run);
  }

  // Cancel: while the run is live, unless its sweep's driver drives it (then a link to the sweep).
  function renderCancel() {
    const run = lastRun;
    const cancelable = !TERMINAL.has(run.status) && run.status !== "CANCELING";
    const driven = cancelable && run.driven_by_sweep;
    cancelButton.hidden = !cancelable || driven;
    if (driven) viaSweep.querySelector("a").setAttribute("href", `#/sweeps/${encodeURIComponent(run.sweep_id)}`);
    viaSweep.hidden = !driven;
  }

  function renderEvents(list) {
    const numRestarts = list.filter((e) => e.to_status === "RESTARTING").length;
    const numRequeues = list.filter((e) => e.to_status === "QUEUED" && e.from_status).length;
    setText(restarts, `(${numRestarts} restart${numRestarts === 1 ? "" : "s"}` +
      (numRequeues ? `, ${numRequeues} re-queue${numRequeues === 1 ? "" : "s"}` : "") + ")");
    events.replaceChildren(...list.map((e) => el("li", {
      class: e.to_status === "RESTARTING" || (e.to_status === "QUEUED" && e.from_status) ? "restart" : "",
      dataset: { to: e.to_status } },
    el("time", { datetime: e.time }, formatTime(e.time)),
    " ", e.from_status ? el("span", { class: "muted" }, `${e.from_status} → `) : "", statusBadge(e.to_status),
    el("span", { class: "muted" }, ` attempt ${e.attempt}`),
    e.message ? el("div", { class: "event-message" }, e.message) : "")));
  }

  // The model of a committed checkpoint: download it if exported, else export it (a Ray job
  // consolidates the sharded checkpoint; the next checkpoint poll shows when it is READY).
  function modelCell(checkpoint, exported) {
    if (!checkpoint.committed) return el("td", {}, "–");
    const name = `${runId}-step-${checkpoint.step}.safetensors`;
    const problem = el("span", { class: "field-error small", role: "alert", hidden: true });
    const showProblem = (error) => { setText(problem, errorText(error)); problem.hidden = false; };
    const act = (label, onclick, attrs = {}) => el("button", { type: "button", class: "small", onclick, ...attrs }, label);
    if (exported?.status === "READY") {
      return el("td", {}, act("Download", () => downloadFile(`${path}/model?step=${checkpoint.step}`, name)
        .catch(showProblem), { "data-action": "download-model" }), problem);
    }
    if (exported?.status === "PENDING") return el("td", { class: "muted" }, "exporting…");
    const request = act(exported?.status === "FAILED" ? "Retry export" : "Export", async () => {
      request.disabled = true;
      problem.hidden = true;
      try {
        await postJSON(`${path}/exports`, { step: checkpoint.step });
        await pollCheckpoints();
      } catch (error) {
        showProblem(error);
        request.disabled = false;
      }
    }, { "data-needs": "member", "data-action": "export-model",
         title: exported?.error || "write this checkpoint's model as one file (safetensors and torch)" });
    return el("td", {}, exported?.status === "FAILED" ? el("span", { class: "failed", title: exported.error }, "✕ ") : "",
      request, problem);
  }

  function renderCheckpoints(list, exports = []) {
    if (!list.length) {
      checkpoints.replaceChildren(el("p", { class: "muted" }, "None yet."));
      return;
    }
    const byStep = new Map(exports.map((e) => [e.step, e]));
    checkpoints.replaceChildren(el("div", { class: "table-wrap" }, el("table", { class: "checkpoints-table" },
      el("thead", {}, el("tr", {}, ["step", "epoch", "attempt", "workers", "saved", "size", "state", "model", "location"]
        .map((h) => el("th", { scope: "col" }, h)))),
      el("tbody", {}, list.map((c) => el("tr", { dataset: { step: String(c.step), committed: String(c.committed) } },
        el("td", { class: "num" }, String(c.step)),
        el("td", { class: "num" }, String(c.epoch)),
        el("td", { class: "num" }, String(c.attempt)),
        el("td", { class: "num" }, String(c.world_size)),
        el("td", {}, formatTime(c.time)),
        el("td", { class: "num" }, formatBytes(c.bytes)),
        el("td", {}, c.committed ? "✓ committed" : el("span", { class: "failed", title: c.error || "" },
          `✕ failed${c.error ? `: ${c.error.split("\n")[0].slice(0, 80)}` : ""}`)),
        modelCell(c, byStep.get(c.step)),
        el("td", { class: "location" },
          el("code", { class: "small url", title: c.url }, el("span", { dir: "ltr" }, c.url)))))))));
  }

  async function pollCheckpoints() {
    try {
      const exports = getJSON(`${path}/exports`).catch(() => ({ data: [] }));  // in parallel
      lastCheckpoints = (await getJSON(`${path}/checkpoints`)).data;  // the fork dialog's choices, at once
      renderCheckpoints(lastCheckpoints, (await exports).data);
    } catch (error) {
      // Not worth marking the whole page stale: keep the last list and try again next time.
      if (error instanceof ApiError && error.status === 404) {
        checkpoints.replaceChildren(el("p", { class: "muted" }, "This service does not list checkpoints."));
      }
    }
  }

  async function pollMetrics() {
    for (let page = 0; page < MAX_PAGES_PER_POLL; page += 1) {
      const result = await getJSON(`${path}/metrics?after=${cursor}&limit=${METRICS_PAGE}`);
      charts.add(result.data);
      cursor = result.last_seq;
      if (result.data.length < METRICS_PAGE) return;
    }
  }

  // --- polling ------------------------------------------------------------------------
  const poller = new Poller(async () => {
    let run;
    try {
      const before = lastRun;
      const answer = await getIfChanged(path);
      run = answer.data;
      if (answer.changed || !before) render(run);
      else renderDurationFact(facts.querySelector('[data-fact="duration"]'), run);
      if (eventsDue || before.status !== run.status || before.attempt !== run.attempt || polls % EVENTS_EVERY === 0) {
        renderEvents((await getJSON(`${path}/events`)).data);
        await pollCheckpoints();
        await renderChildren(path, children).catch(() => {}); // keep the last list; try again next time
        eventsDue = false;
      }
    } catch (error) {
      if (error instanceof ApiError && error.status === 404) {
        root.replaceChildren(el("h1", {}, "Run not found"), errorBox(`No run with id ${runId}.`),
          el("p", {}, el("a", { href: "#/runs" }, "Back to the runs")));
      }
      throw error;
    }
    await pollMetrics();
    await logPane.poll(run);
    polls += 1;
    return TERMINAL.has(run.status) ? ctx.pollMs * FINISHED_SLOWDOWN : ctx.pollMs;
  }, { intervalMs: ctx.pollMs, onState: ctx.setLive }).start();

  return () => {
    poller.stop();
    charts.destroy();
    delete root.dataset.projectRole;
    cancel.close();
    housekeeping.close();
    resume.close();
    fork.close();
    continuation.close();
  };
}

function cancelMessage(run) {
  return `“${run.name}” is ${run.status}. Its Ray job is stopped and the run ends as CANCELED. This cannot be undone.`;
}

function sweepLink(run) {
  return el("span", {}, el("a", { href: `#/sweeps/${encodeURIComponent(run.sweep_id)}`, class: "sweep-link" },
    `sweep ${run.sweep_id}`), el("span", { class: "muted" }, ` · trial ${run.trial_id || "?"}`));
}
