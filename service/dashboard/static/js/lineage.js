// Lineage on the run page: the parent and the children (forks) of a run, the "Fork…" dialog
// (the spec as editable YAML; what changed is sent as a JSON Merge Patch) and the "Continue…"
// dialog of a COMPLETED run. Both dialogs stay open and show the API's refusal (422, 409).

import { dump, load } from "../vendor/js-yaml.mjs";
import { errorText, getJSON, postJSON } from "./api.js";
import { el, statusBadge } from "./ui.js";

const isObject = (value) => value !== null && typeof value === "object" && !Array.isArray(value);

/** Equal as JSON values, whatever the order of object keys (YAML editors and dumpers reorder them). */
function sameValue(a, b) {
  if (Array.isArray(a) || Array.isArray(b)) {
    return Array.isArray(a) && Array.isArray(b) && a.length === b.length && a.every((x, i) => sameValue(x, b[i]));
  }
  if (isObject(a) && isObject(b)) {
    const keys = Object.keys(a);
    return keys.length === Object.keys(b).length && keys.every((key) => key in b && sameValue(a[key], b[key]));
  }
  return a === b;
}

/**
 * The JSON Merge Patch that turns `before` into `after`: removed keys are null, objects differ
 * key by key, except an object whose `name` changed (another optimizer), which is sent whole.
 */
export function mergePatch(before, after) {
  const patch = {};
  for (const key of Object.keys(before)) if (!(key in after)) patch[key] = null;
  for (const [key, value] of Object.entries(after)) {
    const old = before[key];
    if (sameValue(old, value)) continue;
    patch[key] = isObject(old) && isObject(value) && old.name === value.name ? mergePatch(old, value) : value;
  }
  return patch;
}

/** "Parent" fact: a link to the run this one was forked from, and what it started from. */
export function parentFact(run) {
  if (!run.parent_id) return null;
  const origin = run.fork?.step != null ? ` · from its batch ${run.fork.step}` : " · from scratch";
  return ["Parent", el("span", {}, el("a", { href: `#/runs/${encodeURIComponent(run.parent_id)}`, id: "parent-link" },
    `run ${run.parent_id}`), el("span", { class: "muted" }, origin))];
}

/** The "Forks" list: GET /runs/{id}/children, each linked. */
export async function renderChildren(path, slot) {
  const children = (await getJSON(`${path}/children`)).data;
  slot.replaceChildren(children.length
    ? el("ul", { class: "children", id: "run-children" }, children.map((child) => el("li", {},
      el("a", { href: `#/runs/${encodeURIComponent(child.id)}` }, child.name, " ", el("span", { class: "mono small" },
        child.id)), " ", statusBadge(child.status),
      el("span", { class: "muted small" }, ` ${Object.keys(child.fork?.patch || {}).join(", ") || "same spec"}`))))
    : el("p", { class: "muted" }, "No forks yet."));
}

function dialogShell(id, title, ...body) {
  const problem = el("p", { class: "field-error", id: `${id}-error`, role: "alert", hidden: true });
  const dialog = el("dialog", { id: `${id}-dialog`, "aria-labelledby": `${id}-dialog-title` },
    el("h2", { id: `${id}-dialog-title` }, title), ...body, problem);
  return { dialog, problem };
}

async function submitting(button, problem, what, action) {
  problem.hidden = true;
  button.disabled = true;
  try {
    await action();
  } catch (error) {
    problem.textContent = `Could not ${what}: ${errorText(error)}`;
    problem.hidden = false;
  } finally {
    button.disabled = false;
  }
}

/** The "Fork this run" dialog: the spec as YAML, where to start from; opens the child on success. */
export function forkDialog(path) {
  let parent = null;
  const text = el("textarea", { id: "fork-spec", class: "mono", rows: "18", spellcheck: "false",
                                "aria-label": "the fork's spec (YAML)" });
  const from = el("select", { id: "fork-from" }, new Option("its latest checkpoint", "latest"),
    new Option("scratch (fresh weights)", "scratch"));
  const confirm = el("button", { type: "submit", class: "primary", id: "confirm-fork" }, "Fork run");
  const form = el("form", { id: "fork-form" },
    el("p", { class: "muted small" }, "Edit the spec; what you change is recorded as the fork's patch. Starting " +
      "from a checkpoint keeps the model, the surgery algorithms and the data's shapes."),
    text, el("label", { for: "fork-from" }, "Start from "), from,
    el("div", { class: "actions" }, el("button", { type: "button", onclick: () => dialog.close() }, "Close"), confirm));
  const { dialog, problem } = dialogShell("fork", "Fork this run", form);

  form.addEventListener("submit", (event) => {
    event.preventDefault();
    submitting(confirm, problem, "fork", async () => {
      let edited;
      try {
        edited = load(text.value);
      } catch (error) {
        throw new Error(`the YAML does not parse: ${error.message.split("\n")[0]}`);
      }
      if (!isObject(edited)) throw new Error("the spec must be a YAML mapping");
      const source = /^\d+$/.test(from.value) ? { step: Number(from.value) } : from.value;
      const child = await postJSON(`${path}/fork`, { patch: mergePatch(parent.spec, edited), from: source });
      dialog.close();
      window.location.hash = `#/runs/${encodeURIComponent(child.id)}`;
    });
  });

  return {
    dialog,
    open(run, checkpoints = []) {
      parent = run;
      text.value = dump(run.spec);
      from.replaceChildren(new Option("its latest checkpoint", "latest"), new Option("scratch (fresh weights)", "scratch"),
        ...checkpoints.filter((c) => c.committed).map((c) => new Option(`its checkpoint at batch ${c.step}`, String(c.step))));
      problem.hidden = true;
      dialog.showModal();
    },
    close() { if (dialog.open) dialog.close(); },
  };
}

/** The "Continue this run" dialog: a longer max_duration in the same unit. */
export function continueDialog(path, onContinued) {
  const duration = el("input", { id: "continue-duration", name: "max_duration", required: true, class: "mono",
                                 "aria-describedby": "continue-help" });
  const help = el("p", { id: "continue-help", class: "muted small" });
  const confirm = el("button", { type: "submit", class: "primary", id: "confirm-continue" }, "Continue run");
  const form = el("form", { id: "continue-form" }, el("label", { for: "continue-duration" }, "New max_duration "),
    duration, help,
    el("div", { class: "actions" }, el("button", { type: "button", onclick: () => dialog.close() }, "Close"), confirm));
  const { dialog, problem } = dialogShell("continue", "Continue this run", form);

  form.addEventListener("submit", (event) => {
    event.preventDefault();
    submitting(confirm, problem, "continue", async () => {
      const run = await postJSON(`${path}/continue`, { max_duration: duration.value.trim() });
      dialog.close();
      onContinued(run);
    });
  });

  return {
    dialog,
    open(run) {
      help.textContent = `It trained for ${run.spec.max_duration}. Attempt ${run.attempt + 1} resumes from its ` +
        "newest committed checkpoint; give a longer duration in the same unit.";
      duration.value = "";
      problem.hidden = true;
      dialog.showModal();
    },
    close() { if (dialog.open) dialog.close(); },
  };
}
