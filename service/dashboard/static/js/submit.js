// Submit: paste or upload a RunSpec or a SweepSpec (YAML or JSON), POST it to /runs or /sweeps,
// and show each problem the API names (422: [{field, msg, input}]) next to the line of the spec
// where that field is (a sweep's fields read `base.optimizer.lr`, `search.params['optimizer.lr']`).
//
// Run or sweep: a choice on the page, always shown and always the user's to change. It follows
// the text when a whole spec arrives (a paste, a drop, an upload, an example, the draft the page
// opens with): a top-level `base` or `search` is a SweepSpec, a top-level `model` a RunSpec.
// Typing never flips it; a note says when the text and the choice disagree.

import { load } from "../vendor/js-yaml.mjs";
import { ApiError, getJSON, postJSON } from "./api.js";
import { fieldLines, locateField } from "./spec_source.js";
import { DRAFT_KEY, el, errorBox, setText } from "./ui.js";

const KIND_KEY = "tessera.submit.kind"; // the choice, for a draft that does not say

const EXAMPLE = `# ResNet-20 on scikit-learn's digits, two DDP workers on CPU (about a minute).
name: digits-resnet
model: {name: cifar_resnet20}
data:
  train: {name: digits, split: train}
  eval: {name: digits, split: test}
  batch_size: 64
optimizer: {name: sgd, lr: 0.1, momentum: 0.9, weight_decay: 0.0005}
scheduler: {name: cosine, warmup: "0.1dur"}
max_duration: "3ep"
eval_interval: "1ep"
precision: fp32
algorithms:
  - {name: label_smoothing, smoothing: 0.1}
  - {name: channels_last}
  - {name: cutmix, alpha: 1.0}
parallelism: {strategy: ddp, num_workers: 2}
seed: 42
`;

// examples/digits_sweep.yaml (a test holds the two together).
const SWEEP_EXAMPLE = `# Which of three speedup methods (alone or none) and which learning rate give ResNet-20 on
# digits its best eval accuracy? 4 algorithm sets x 2 learning rates = 8 trials, two at a
# time. ASHA's rung is at two of the three epochs: a trial below the median of those that reached
# it before is stopped there (after one epoch every trial is still near chance). Each trial is a
# run of its own.
name: digits-recipes
base:
  name: digits-resnet
  model: {name: cifar_resnet20}
  data:
    train: {name: digits, split: train}
    eval: {name: digits, split: test}       # trials report eval/accuracy only with eval data
    batch_size: 64
  optimizer: {name: sgd, lr: 0.1, momentum: 0.9, weight_decay: 0.0005}
  scheduler: {name: cosine, warmup: "0.1dur"}
  max_duration: "3ep"
  eval_interval: "1ep"
  parallelism: {strategy: none}
  seed: 42
search:
  algorithms: {pool: [label_smoothing, channels_last, cutmix], max_size: 1}   # [], and each alone
  params:
    optimizer.lr: {grid: [0.05, 0.1]}
metric: eval/accuracy                       # mode follows the metric (max)
scheduler: {name: asha, grace_period: "2ep", reduction_factor: 2}
max_concurrent_trials: 2
`;

// What differs between submitting a run and a sweep.
const KINDS = {
  run: {
    spec: "RunSpec", path: "/runs", route: "runs", example: EXAMPLE, prefix: "",
    placeholder: "name: my-run\nmodel: {name: simple_cnn}\ndata: {train: {name: digits}, batch_size: 64}\n" +
      "optimizer: {name: adamw, lr: 0.001}\nmax_duration: 2ep",
  },
  sweep: {
    spec: "SweepSpec", path: "/sweeps", route: "sweeps", example: SWEEP_EXAMPLE, prefix: "base.",
    placeholder: "name: my-sweep\nbase:  # a RunSpec\n  name: my-run\n  model: {name: simple_cnn}\n" +
      "  data: {train: {name: digits}, eval: {name: digits, split: test}, batch_size: 64}\n" +
      "  optimizer: {name: adamw, lr: 0.001}\n  max_duration: 2ep\nsearch:\n  params:\n" +
      "    optimizer.lr: {grid: [0.001, 0.003]}",
  },
};

/**
 * What `text` is: "sweep" when its top level has `base` or `search` (a SweepSpec), "run" when it
 * has `model` (a RunSpec), null when it says neither (empty, a bare name, not a mapping).
 * Text that does not parse yet is judged by its unindented keys.
 */
export function detectKind(text) {
  let keys;
  try {
    const value = load(text);
    keys = value && typeof value === "object" && !Array.isArray(value) ? Object.keys(value) : [];
  } catch {
    keys = [...text.matchAll(/^["']?([A-Za-z_]\w*)["']?\s*:/gm)].map((match) => match[1]);
  }
  if (keys.includes("base") || keys.includes("search")) return "sweep";
  if (keys.includes("model")) return "run";
  return null;
}

export function mount(root, ctx) {
  let alive = true;
  const draft = sessionStorage.getItem(DRAFT_KEY) || "";
  let kind = detectKind(draft) || (sessionStorage.getItem(KIND_KEY) === "sweep" ? "sweep" : "run");
  const textarea = el("textarea", { id: "spec-text", name: "spec", rows: "26", spellcheck: "false",
    autocapitalize: "off", autocomplete: "off", class: "mono", "aria-describedby": "spec-help kind-note" });
  textarea.value = draft;
  textarea.addEventListener("input", (event) => {
    sessionStorage.setItem(DRAFT_KEY, textarea.value);
    problems.classList.toggle("outdated", problems.childElementCount > 0);
    // A pasted or dropped spec is a whole one: the choice follows it. Typing leaves the choice alone.
    if (event.inputType === "insertFromPaste" || event.inputType === "insertFromDrop") followText();
    else noteMismatch();
  });
  const kindRadios = Object.keys(KINDS).map((value) => el("input", { type: "radio", name: "kind", id: `kind-${value}`,
    value, checked: value === kind, onchange: () => setKind(value) }));
  const kindNote = el("p", { id: "kind-note", class: "muted small", "aria-live": "polite" });
  const kindChoice = el("fieldset", { class: "kind-choice", id: "kind-choice" },
    el("legend", {}, "Submit as"),
    el("label", { for: "kind-run" }, kindRadios[0], " Run ", el("span", { class: "muted small" }, "(RunSpec)")),
    el("label", { for: "kind-sweep" }, kindRadios[1], " Sweep ", el("span", { class: "muted small" },
      "(SweepSpec: a base RunSpec and a search)")));
  const fileInput = el("input", { type: "file", id: "spec-file", accept: ".yaml,.yml,.json,application/json,text/yaml",
    onchange: async () => {
      const file = fileInput.files[0];
      if (!file) return;
      replaceText(await file.text());
    } });
  const specLabel = el("label", { for: "spec-text" });
  const submitButton = el("button", { type: "submit", class: "primary", id: "submit-run" });
  const exampleButton = el("button", { type: "button", id: "load-example", onclick: () => {
    replaceText(KINDS[kind].example);
    textarea.focus();
  } });
  const problems = el("section", { id: "problems", "aria-live": "polite", tabindex: "-1" });
  const form = el("form", { id: "submit-form", class: "submit-form", onsubmit: (e) => { e.preventDefault(); submit(); } },
    kindChoice,
    specLabel,
    el("p", { id: "spec-help", class: "muted small" },
      "Paste a spec, upload a file, or start from the example. Unknown fields are refused; ",
      "the API's answer appears next to the offending line."),
    textarea,
    kindNote,
    el("div", { class: "actions" },
      submitButton,
      exampleButton,
      el("label", { class: "file-label", for: "spec-file" }, "Upload a file: "), fileInput));
  const heading = el("h1", {});
  const names = el("div", { class: "catalog-names muted small" });
  root.append(
    el("div", { class: "page-head" }, heading),
    el("div", { class: "submit-layout" }, form, el("div", { class: "submit-side" }, problems, names)),
  );
  let catalog = null; // {models, datasets, algorithms}, once loaded
  loadCatalog().then((loaded) => { if (alive && loaded) { catalog = loaded; paintNames(); } });
  paintKind();

  function setKind(value) {
    kind = value;
    sessionStorage.setItem(KIND_KEY, kind);
    paintKind();
  }

  /** Everything that names the kind: the radios, heading, label, buttons, the names panel. */
  function paintKind() {
    const { spec, placeholder } = KINDS[kind];
    for (const radio of kindRadios) radio.checked = radio.value === kind;
    setText(heading, `Submit a ${kind}`);
    setText(specLabel, `${spec} (YAML or JSON)`);
    textarea.placeholder = placeholder;
    setText(submitButton, `Submit ${kind}`);
    setText(exampleButton, `Load ${kind} example`);
    paintNames();
    noteMismatch();
  }

  function noteMismatch() {
    const detected = detectKind(textarea.value);
    setText(kindNote, detected && detected !== kind
      ? `This text looks like a ${KINDS[detected].spec} (${detected === "sweep" ? "it has base or search at the top"
        : "it has model at the top, and no base or search"}): choose ${detected === "sweep" ? "Sweep" : "Run"} ` +
        `above to submit it as a ${detected}.`
      : "");
  }

  /** A whole new text (an upload, a paste, an example): the choice follows it. */
  function replaceText(text) {
    textarea.value = text;
    sessionStorage.setItem(DRAFT_KEY, text);
    clearProblems();
    followText();
  }

  function followText() {
    const detected = detectKind(textarea.value);
    if (detected && detected !== kind) setKind(detected);
    else noteMismatch();
  }

  function paintNames() {
    if (!catalog) return;
    const { prefix } = KINDS[kind];
    names.replaceChildren(...[el("h2", {}, "Names this service knows"), el("dl", { class: "facts" },
      el("dt", {}, `${prefix}model.name`), el("dd", { class: "mono" }, catalog.models.join(", ")),
      el("dt", {}, `${prefix}data.train.name`), el("dd", { class: "mono" }, catalog.datasets.join(", ")),
      el("dt", {}, kind === "sweep" ? "base.algorithms[].name, search.algorithms" : "algorithms[].name"),
      el("dd", { class: "mono" }, catalog.algorithms.join(", "))),
    el("p", {}, "Parameters of each algorithm: ", el("a", { href: "#/algorithms" }, "Algorithms"), "."),
    kind === "sweep" ? el("p", {}, "A sweep's search: docs/sweeps.md in the repository (", el("code", {}, "search.params"),
      " keys are the base's dotted fields, such as ", el("code", {}, "optimizer.lr"), ").") : null].filter(Boolean));
  }

  function clearProblems() {
    problems.replaceChildren();
    problems.classList.remove("outdated");
    textarea.removeAttribute("aria-invalid");
  }

  async function submit() {
    clearProblems();
    const text = textarea.value;
    const { spec: specName, path, route } = KINDS[kind];
    let spec;
    try {
      spec = parseSpec(text, specName);
    } catch (error) {
      showProblems(text, [error.problem || { field: "", msg: error.message }], "The spec could not be read");
      return;
    }
    submitButton.disabled = true;
    try {
      const created = await postJSON(path, spec);
      sessionStorage.removeItem(DRAFT_KEY);
      window.location.hash = `#/${route}/${encodeURIComponent(created.id)}`;
    } catch (error) {
      if (error instanceof ApiError && error.status === 422 && Array.isArray(error.detail)) {
        showProblems(text, error.detail, `The API refused the ${kind}`);
      } else {
        problems.replaceChildren(errorBox(`Could not submit: ${error.message}`));
      }
    } finally {
      submitButton.disabled = false;
    }
  }

  function showProblems(text, items, heading) {
    const lines = fieldLines(text);
    const byLine = new Map();
    const unplaced = [];
    for (const item of items) {
      const where = item.line ? { line: item.line, exact: true } : locateField(lines, item.field || "");
      if (where) {
        if (!byLine.has(where.line)) byLine.set(where.line, []);
        byLine.get(where.line).push({ ...item, exact: where.exact });
      } else {
        unplaced.push(item);
      }
    }
    textarea.setAttribute("aria-invalid", "true");
    const source = el("ol", { class: "source-view mono", "aria-label": "the spec, annotated" },
      text.replace(/\n$/, "").split("\n").map((content, index) => {
        const line = index + 1;
        const found = byLine.get(line) || [];
        return el("li", { value: String(line), dataset: { line: String(line) }, class: found.length ? "has-error" : "" },
          el("code", {}, content || " "),
          found.map((item) => problemNote(item, line)));
      }));
    problems.replaceChildren(...[
      el("h2", {}, `${heading}: ${items.length} problem${items.length === 1 ? "" : "s"}`),
      unplaced.length ? el("ul", { class: "spec-level" }, unplaced.map((item) => el("li", {},
        el("div", { class: "field-error", role: "note", dataset: { field: item.field || "" } }, describe(item))))) : null,
      byLine.size ? source : null,
    ].filter(Boolean));
    const firstError = source.querySelector(".has-error");
    if (firstError) source.scrollTop = Math.max(0, firstError.offsetTop - source.clientHeight / 3);
    problems.focus(); // scrolls the problems into view where they sit below the form (narrow windows)
  }

  function problemNote(item, line) {
    return el("div", { class: "field-error", role: "note", dataset: { field: item.field || "", line: String(line) } },
      el("span", {}, describe(item) + (item.exact ? "" : " (the field is missing here)")), " ",
      el("button", { type: "button", class: "link small", onclick: () => selectLine(textarea, line) }, `edit line ${line}`));
  }

  return () => { alive = false; };
}

/** `field: message (got value)`, like the CLI prints a 422. */
function describe(item) {
  const got = item.input !== undefined && item.input !== null ? ` (got ${JSON.stringify(item.input)})` : "";
  return `${item.field || "spec"}: ${item.msg}${got}`;
}

/** JSON if it looks like JSON, else YAML. A syntax error carries the line it happened on. */
function parseSpec(text, specName) {
  if (!text.trim()) throw Object.assign(new Error("empty"), { problem: { field: "", msg: `paste or upload a ${specName} first` } });
  let value;
  if (text.trim().startsWith("{")) {
    try {
      value = JSON.parse(text);
    } catch (error) {
      const at = /position (\d+)/.exec(error.message);
      const line = at ? text.slice(0, Number(at[1])).split("\n").length : undefined;
      throw Object.assign(error, { problem: { field: "", msg: `not valid JSON: ${error.message}`, line } });
    }
  } else {
    try {
      value = load(text);
    } catch (error) {
      const line = error.mark ? error.mark.line + 1 : undefined;
      throw Object.assign(error, { problem: { field: "", msg: `not valid YAML: ${error.reason || error.message}`, line } });
    }
  }
  if (value === null || typeof value !== "object" || Array.isArray(value)) {
    const msg = `a ${specName} is a mapping of fields (${specName === "SweepSpec" ? "name, base, search" : "name, model, data"}, ...)`;
    throw Object.assign(new Error("not a mapping"), { problem: { field: "", msg } });
  }
  return value;
}

function selectLine(textarea, line) {
  const lines = textarea.value.split("\n");
  const start = lines.slice(0, line - 1).reduce((n, l) => n + l.length + 1, 0);
  textarea.focus();
  textarea.setSelectionRange(start, start + (lines[line - 1] || "").length);
}

/** The catalog's names for the help panel, or null where the API did not answer (the form works without). */
async function loadCatalog() {
  try {
    const [models, datasets, algorithms] = await Promise.all(
      ["/models", "/datasets", "/algorithms"].map(async (p) => (await getJSON(p)).data.map((e) => e.name)));
    return { models, datasets, algorithms };
  } catch {
    return null;
  }
}
