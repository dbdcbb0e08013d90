// Submit: paste or upload a RunSpec (YAML or JSON), POST it, and show each problem the API
// names (422: [{field, msg, input}]) next to the line of the spec where that field is.

import { load } from "../vendor/js-yaml.mjs";
import { ApiError, getJSON, postJSON } from "./api.js";
import { fieldLines, locateField } from "./spec_source.js";
import { DRAFT_KEY, el, errorBox } from "./ui.js";

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

export function mount(root, ctx) {
  let alive = true;
  const textarea = el("textarea", { id: "spec-text", name: "spec", rows: "26", spellcheck: "false",
    autocapitalize: "off", autocomplete: "off", class: "mono", "aria-describedby": "spec-help",
    placeholder: "name: my-run\nmodel: {name: simple_cnn}\ndata: {train: {name: digits}, batch_size: 64}\n" +
      "optimizer: {name: adamw, lr: 0.001}\nmax_duration: 2ep" });
  textarea.value = sessionStorage.getItem(DRAFT_KEY) || "";
  textarea.addEventListener("input", () => {
    sessionStorage.setItem(DRAFT_KEY, textarea.value);
    problems.classList.toggle("outdated", problems.childElementCount > 0);
  });
  const fileInput = el("input", { type: "file", id: "spec-file", accept: ".yaml,.yml,.json,application/json,text/yaml",
    onchange: async () => {
      const file = fileInput.files[0];
      if (!file) return;
      textarea.value = await file.text();
      sessionStorage.setItem(DRAFT_KEY, textarea.value);
      clearProblems();
    } });
  const submitButton = el("button", { type: "submit", class: "primary", id: "submit-run" }, "Submit run");
  const problems = el("section", { id: "problems", "aria-live": "polite", tabindex: "-1" });
  const form = el("form", { id: "submit-form", class: "submit-form", onsubmit: (e) => { e.preventDefault(); submit(); } },
    el("label", { for: "spec-text" }, "RunSpec (YAML or JSON)"),
    el("p", { id: "spec-help", class: "muted small" },
      "Paste a spec, upload a file, or start from the example. Unknown fields are refused; ",
      "the API's answer appears next to the offending line."),
    textarea,
    el("div", { class: "actions" },
      submitButton,
      el("button", { type: "button", id: "load-example", onclick: () => {
        textarea.value = EXAMPLE;
        sessionStorage.setItem(DRAFT_KEY, EXAMPLE);
        clearProblems();
        textarea.focus();
      } }, "Load example"),
      el("label", { class: "file-label", for: "spec-file" }, "Upload a file: "), fileInput));
  const names = el("div", { class: "catalog-names muted small" });
  root.append(
    el("div", { class: "page-head" }, el("h1", {}, "Submit a run")),
    el("div", { class: "submit-layout" }, form, el("div", { class: "submit-side" }, problems, names)),
  );
  loadNames(names, () => alive);

  function clearProblems() {
    problems.replaceChildren();
    problems.classList.remove("outdated");
    textarea.removeAttribute("aria-invalid");
  }

  async function submit() {
    clearProblems();
    const text = textarea.value;
    let spec;
    try {
      spec = parseSpec(text);
    } catch (error) {
      showProblems(text, [error.problem || { field: "", msg: error.message }], "The spec could not be read");
      return;
    }
    submitButton.disabled = true;
    try {
      const run = await postJSON("/runs", spec);
      sessionStorage.removeItem(DRAFT_KEY);
      window.location.hash = `#/runs/${encodeURIComponent(run.id)}`;
    } catch (error) {
      if (error instanceof ApiError && error.status === 422 && Array.isArray(error.detail)) {
        showProblems(text, error.detail, "The API refused the spec");
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
function parseSpec(text) {
  if (!text.trim()) throw Object.assign(new Error("empty"), { problem: { field: "", msg: "paste or upload a RunSpec first" } });
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
    const msg = "a RunSpec is a mapping of fields (name, model, data, ...)";
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

async function loadNames(target, alive) {
  try {
    const [models, datasets, algorithms] = await Promise.all(
      ["/models", "/datasets", "/algorithms"].map(async (p) => (await getJSON(p)).data.map((e) => e.name)));
    if (!alive()) return;
    target.replaceChildren(el("h2", {}, "Names this service knows"), el("dl", { class: "facts" },
      el("dt", {}, "model.name"), el("dd", { class: "mono" }, models.join(", ")),
      el("dt", {}, "data.train.name"), el("dd", { class: "mono" }, datasets.join(", ")),
      el("dt", {}, "algorithms[].name"), el("dd", { class: "mono" }, algorithms.join(", "))),
    el("p", {}, "Parameters of each algorithm: ", el("a", { href: "#/algorithms" }, "Algorithms"), "."));
  } catch {
    /* only a help panel: the form works without it */
  }
}
