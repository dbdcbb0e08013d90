// The run page's lifecycle actions: "Cancel run…" (through ./confirm.js), which a trial that its
// sweep's driver drives cannot take (the API answers 409: its sweep is canceled instead, so the
// page links there), and the "Resume this run?" dialog.

import { errorText, postJSON } from "./api.js";
import { confirmDialog } from "./confirm.js";
import { el } from "./ui.js";

/** "Cancel this run?": POST /runs/{id}/cancel; `onCanceled(run)` gets the API's answer. */
export function cancelDialog(path, onCanceled, onError) {
  return confirmDialog({
    id: "cancel-dialog", title: "Cancel this run?", keep: "Keep running", confirm: "Cancel run",
    confirmId: "confirm-cancel",
    onConfirm: async () => onCanceled(await postJSON(`${path}/cancel`, undefined)),
    onError: (message) => onError(`Could not cancel: ${message}`),
  });
}

/** What stands for "Cancel run…" on a trial its sweep drives: where to cancel it instead (set its link's href). */
export function cancelViaSweep() {
  return el("p", { class: "muted small", id: "cancel-via-sweep", hidden: true, "data-needs": "member" },
    "Its sweep drives this trial: ", el("a", { id: "cancel-via-sweep-link" }, "cancel the sweep"), " to stop it.");
}

/**
 * The "Resume this run?" dialog: an optional number of workers, then POST /runs/{id}/resume.
 * It stays open and shows the API's answer when the API refuses (409, 422).
 */
export function resumeDialog(path, onResumed) {
  const message = el("p");
  const workers = el("input", { type: "number", id: "resume-workers", name: "num_workers", min: "1", max: "1024",
                                step: "1", inputmode: "numeric", "aria-describedby": "resume-workers-help" });
  const help = el("p", { id: "resume-workers-help", class: "muted small" });
  const problem = el("p", { class: "field-error", id: "resume-error", role: "alert", hidden: true });
  const confirm = el("button", { type: "submit", class: "primary", id: "confirm-resume" }, "Resume run");
  const form = el("form", { id: "resume-form" },
    el("label", { for: "resume-workers" }, "Workers (optional)"), " ", workers, help, problem,
    el("div", { class: "actions" },
      el("button", { type: "button", autofocus: true, onclick: () => dialog.close() }, "Keep as is"), confirm));
  const dialog = el("dialog", { id: "resume-dialog", "aria-labelledby": "resume-dialog-title" },
    el("h2", { id: "resume-dialog-title" }, "Resume this run?"), message, form);

  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const body = workers.value.trim() ? { num_workers: Number(workers.value) } : {};
    problem.hidden = true;
    confirm.disabled = true;
    try {
      const run = await postJSON(`${path}/resume`, body);
      dialog.close();
      onResumed(run);
    } catch (error) {
      problem.textContent = `Could not resume: ${errorText(error)}`;
      problem.hidden = false;
    } finally {
      confirm.disabled = false;
    }
  });

  return {
    dialog,
    open(run) {
      const current = run.spec?.parallelism?.num_workers;
      message.textContent = `“${run.name}” is ${run.status}. Attempt ${run.attempt + 1} starts from its newest ` +
        "committed checkpoint (from the beginning if it has none)" +
        (run.sweep_id ? " and continues as a standalone run to its full duration." : ".");
      help.textContent = `Empty: keep ${current ?? "the spec's"} worker${current === 1 ? "" : "s"}. ` +
        "Another number reshards the checkpoint.";
      workers.value = "";
      problem.hidden = true;
      dialog.showModal();
    },
    close() { if (dialog.open) dialog.close(); },
  };
}
