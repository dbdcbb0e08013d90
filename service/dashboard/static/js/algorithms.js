// Algorithms: the catalog (GET /algorithms) with each method card
// (GET /algorithms/{name}/card, markdown) rendered by marked and sanitized by DOMPurify.
// The catalog cannot change while the service runs, so this page loads once and never polls.

import DOMPurify from "../vendor/purify.es.mjs";
import { Marked } from "../vendor/marked.esm.js";
import { ApiError, getJSON, getText } from "./api.js";
import { el, errorBox } from "./ui.js";

// Cards start at "# Title"; on this page that sits under the card's own <h2>.
const markdown = new Marked({
  gfm: true,
  walkTokens(token) {
    if (token.type === "heading") token.depth = Math.min(token.depth + 2, 6);
  },
});

export function mount(root, ctx) {
  let alive = true;
  const jump = el("nav", { class: "jump small", "aria-label": "algorithms on this page" });
  const list = el("div", { class: "algorithm-list", "aria-busy": "true" }, el("p", { class: "muted" }, "Loading…"));
  root.append(
    el("div", { class: "page-head" }, el("h1", {}, "Algorithms")),
    el("p", { class: "muted" }, "Speedup methods a RunSpec can list under ",
      el("code", {}, "algorithms"), ". Parameters come from each method's spec; the method card from ",
      el("code", {}, "api/method_cards/<name>.md"), "."),
    jump,
    list,
  );

  (async () => {
    let catalog;
    try {
      catalog = (await getJSON("/algorithms")).data;
    } catch (error) {
      if (alive) list.replaceChildren(errorBox(`Could not load the catalog: ${error.message}. Reload to try again.`));
      return;
    }
    if (!alive) return;
    jump.replaceChildren("Jump to: ", ...catalog.map((entry) => el("button", { type: "button", class: "link",
      onclick: () => {
        const target = document.getElementById(`algorithm-${entry.name}`);
        target.scrollIntoView({ block: "start" });
        target.querySelector("h2").focus({ preventScroll: true });
      } }, entry.title)));
    list.replaceChildren(...catalog.map(card));
    list.removeAttribute("aria-busy");
    ctx.setLive({ ok: true, at: new Date() });
    await Promise.all(catalog.map(async (entry) => {
      const slot = list.querySelector(`[data-card="${entry.name}"]`);
      try {
        const html = DOMPurify.sanitize(markdown.parse(await getText(`/algorithms/${encodeURIComponent(entry.name)}/card`)));
        if (!alive) return;
        slot.innerHTML = html;
        const first = slot.firstElementChild;
        if (first && /^H\d$/.test(first.tagName) && first.textContent.trim() === entry.title) first.remove();
      } catch (error) {
        if (!alive) return;
        slot.replaceChildren(error instanceof ApiError && error.status === 404
          ? el("p", { class: "muted" }, "No method card yet.")
          : errorBox(`Could not load the method card: ${error.message}`));
      }
      slot.removeAttribute("aria-busy");
    }));
  })();

  return () => { alive = false; };
}

function card(entry) {
  const params = Object.entries(entry.params_schema?.properties || {}).filter(([name]) => name !== "name");
  return el("article", { class: "algorithm", id: `algorithm-${entry.name}`, "aria-labelledby": `algorithm-${entry.name}-h` },
    el("header", {},
      el("h2", { id: `algorithm-${entry.name}-h`, tabindex: "-1" }, entry.title, " ", el("code", { class: "small" }, entry.name)),
      el("ul", { class: "chips", "aria-label": "properties" },
        el("li", { class: `chip maturity-${entry.maturity}` }, `maturity: ${entry.maturity}`),
        el("li", { class: "chip" }, `domain: ${entry.domain}`),
        entry.changes_model ? el("li", { class: "chip" }, "changes the model (surgery)") : null,
        entry.needs_images ? el("li", { class: "chip" }, "works on image pixels: not for feature vectors") : null)),
    el("div", { class: "algorithm-body" },
      el("div", { class: "algorithm-meta" },
        el("p", {}, entry.summary),
        el("dl", { class: "facts" },
          el("dt", {}, "Needs"), el("dd", {}, entry.needs.length ? entry.needs.join(", ") : "nothing special"),
          el("dt", {}, "Conflicts with"), el("dd", {}, entry.conflicts.length ? entry.conflicts.join(", ") : "none"),
          el("dt", {}, "Attribution"), el("dd", {}, entry.attribution)),
        el("h3", {}, "Parameters"),
        params.length ? paramsTable(params) : el("p", { class: "muted" }, "none"),
        el("p", { class: "small" }, "In a RunSpec: ", el("code", {}, exampleEntry(entry.name, params)))),
      el("section", { class: "method-card", "aria-label": `${entry.title} method card`, "aria-busy": "true",
                      dataset: { card: entry.name } }, el("p", { class: "muted" }, "Loading the method card…"))));
}

function paramsTable(params) {
  return el("dl", { class: "params" }, params.flatMap(([name, schema]) => {
    const facts = [schemaType(schema), "default" in schema ? `default ${JSON.stringify(schema.default)}` : "required",
                   schemaRange(schema)].filter(Boolean).join(" · ");
    return [el("dt", {}, el("code", {}, name), " ", el("span", { class: "muted small" }, facts)),
            el("dd", {}, schema.description || "")];
  }));
}

function schemaType(schema) {
  if (schema.enum) return "one of";
  if (schema.anyOf) return schema.anyOf.map(schemaType).join(" | ");
  return schema.type || (schema.const !== undefined ? JSON.stringify(schema.const) : "");
}

function schemaRange(schema) {
  if (schema.enum) return schema.enum.map((v) => JSON.stringify(v)).join(", ");
  const parts = [];
  if ("minimum" in schema) parts.push(`≥ ${schema.minimum}`);
  if ("exclusiveMinimum" in schema) parts.push(`> ${schema.exclusiveMinimum}`);
  if ("maximum" in schema) parts.push(`≤ ${schema.maximum}`);
  if ("exclusiveMaximum" in schema) parts.push(`< ${schema.exclusiveMaximum}`);
  return parts.join(", ");
}

function exampleEntry(name, params) {
  const fields = params.filter(([, s]) => "default" in s).map(([k, s]) => `${k}: ${JSON.stringify(s.default)}`);
  return `{name: ${name}${fields.length ? ", " + fields.join(", ") : ""}}`;
}
