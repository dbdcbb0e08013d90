// Compare: 2–8 runs (`#/compare?ids=a,b,c`) on one page. Their curves overlaid, one chart per
// metric key (what training measured first, the bookkeeping keys behind "show all"); the spec
// fields that differ (dotted paths, `specDiff` below: the twin of api/spec_diff.py, a test holds
// the two together); their latest and best values side by side.
// Ended runs do not change, so the page loads once instead of polling. The curves' x-axis is the
// step, the fraction of max_duration (runs of other lengths or batch sizes line up) or the seconds
// since a run's first point (`&x=step|progress|time`, the picker above the curves).

import { getJSON } from "./api.js";
import { COLORS, MetricChart } from "./charts.js";
import { el, errorBox, formatNumber, statusBadge } from "./ui.js";

export const MIN_RUNS = 2;
export const MAX_RUNS = 8;
const METRICS_PAGE = 10_000;
const MAX_PAGES = 20; // 200k points per run: enough for any chart a person reads

// Keys a run reports to keep its books (README, "Metric keys"), not to say how well it trained:
// their curves wait behind "show all", and their "best" (the highest lr, the last epoch) means
// nothing, so only their latest value is shown.
const BOOKKEEPING = /^(time|checkpoint)\/|^lr($|\/)/;
const isBookkeeping = (key) => BOOKKEEPING.test(key);

/** The x-axes a comparison may use: `of(points)` gives a run's point -> x (null: not placed). */
export const AXES = {
  step: { title: "step", label: "step", of: () => (p) => p.step },
  // time/progress (0..1 of max_duration) is reported at some steps; a run's progress is linear in
  // its steps (max_duration is a number of batches), so one point gives the rest.
  progress: { title: "progress (fraction of max_duration)", label: "progress", of: (points) => {
    const last = points.filter((p) => p.key === "time/progress" && p.step > 0).reduce(
      (latest, p) => (latest === null || p.step > latest.step ? p : latest), null);
    return last === null ? () => null : (p) => (p.step * last.value) / last.step;
  } },
  time: { title: "wall time (seconds since the run's first point, waits between attempts included)",
    label: "seconds", of: (points) => {
      let start = Infinity; // a loop: Math.min(...points) overflows the stack past ~125k points
      for (const p of points) start = Math.min(start, Date.parse(p.time));
      return (p) => (Date.parse(p.time) - start) / 1000;
    } },
};

/** Metric keys in reading order: losses, accuracies and any other measure, then throughput, then bookkeeping. */
export function orderKeys(keys) {
  const rank = (key) => (isBookkeeping(key) ? 2 : key.startsWith("throughput/") ? 1 : 0);
  return [...keys].sort((a, b) => rank(a) - rank(b) || (a < b ? -1 : a > b ? 1 : 0));
}

/** `{path: leaf}` of a JSON value: objects by key, arrays by index; `{}` and `[]` are leaves. */
export function flatten(value, prefix = "", out = {}) {
  const entries = Array.isArray(value) ? value.map((v, i) => [String(i), v])
    : value !== null && typeof value === "object" ? Object.entries(value) : [];
  if (!entries.length) {
    out[prefix] = value;
    return out;
  }
  for (const [key, child] of entries) flatten(child, prefix ? `${prefix}.${key}` : key, out);
  return out;
}

/** The dotted paths whose values differ across `specs`, sorted, each with every spec's value
 *  (null where a spec lacks the path; a path null or absent in every spec is no difference).
 *  Same paths as api.spec_diff.spec_diff. */
export function specDiff(specs) {
  const flats = specs.map((spec) => flatten(spec));
  const paths = [...new Set(flats.flatMap((f) => Object.keys(f)))].sort();
  const diff = {};
  for (const path of paths) {
    const values = flats.map((f) => (path in f ? f[path] : null));
    if (values.every((v) => v === null)) continue; // null or absent in every spec: no difference to show
    const same = flats.every((f) => path in f) && values.every((v) => JSON.stringify(v) === JSON.stringify(values[0]));
    if (!same) diff[path] = values;
  }
  return diff;
}

export function mount(root, ctx) {
  const ids = [...new Set((ctx.query.get("ids") || "").split(",").map((s) => s.trim()).filter(Boolean))];
  const axis = Object.hasOwn(AXES, ctx.query.get("x") || "") ? ctx.query.get("x") : "step";
  const heading = el("h1", {}, "Compare runs");
  root.append(el("p", { class: "crumbs" }, el("a", { href: "#/runs" }, "← Runs")), heading);
  if (ids.length < MIN_RUNS || ids.length > MAX_RUNS) {
    root.append(errorBox(`Pick ${MIN_RUNS} to ${MAX_RUNS} runs to compare (got ${ids.length}): tick them in the ` +
      "runs table, then “Compare”."));
    return null;
  }
  const charts = [];
  let alive = true;
  const body = el("div", { id: "compare", "aria-busy": "true" }, el("p", { class: "muted" }, "Loading…"));
  root.append(body);
  load(ids).then(({ runs, points }) => {
    if (!alive) return;
    body.replaceChildren(...render(runs, points, charts, axis));
    charts.forEach((c) => c.flush()); // drawn once in the page, at its width
    body.setAttribute("aria-busy", "false");
    ctx.setLive(null);
  }).catch((error) => {
    if (alive) body.replaceChildren(errorBox(`Could not load the runs: ${error.message}`));
  });
  return () => { alive = false; charts.forEach((c) => c.destroy()); };
}

async function load(ids) {
  const runs = await Promise.all(ids.map((id) => getJSON(`/runs/${encodeURIComponent(id)}`)));
  const points = await Promise.all(ids.map(async (id) => {
    const all = [];
    let after = 0;
    for (let page = 0; page < MAX_PAGES; page += 1) {
      const result = await getJSON(`/runs/${encodeURIComponent(id)}/metrics?after=${after}&limit=${METRICS_PAGE}`);
      all.push(...result.data);
      after = result.last_seq;
      if (result.data.length < METRICS_PAGE) break;
    }
    return all;
  }));
  return { runs, points };
}

function label(run) {
  return `${run.name} (${run.id.slice(0, 6)})`;
}

/** A run's value of `key` in the summaries: its best and latest; the latest alone for bookkeeping. */
function summaryCell(run, key) {
  const latest = formatNumber(run.summary[key]);
  if (isBookkeeping(key)) return el("td", { class: "num" }, latest, el("span", { class: "muted small" }, " latest"));
  return el("td", { class: "num" }, formatNumber(run.best[key]),
    el("span", { class: "muted small" }, ` best · ${latest} latest`));
}

/** The x-axis picker: choosing another reloads the page with it in the URL (so a link keeps it).
 *  `unplaced`: the runs with points none of which this axis can place, named under it. */
function axisPicker(runs, axis, unplaced) {
  const ids = runs.map((run) => encodeURIComponent(run.id)).join(",");
  const choose = (e) => { window.location.hash = `#/compare?ids=${ids}&x=${e.target.value}`; };
  return el("div", {},
    el("label", { class: "compare-x" }, "x-axis ",
      el("select", { id: "compare-x", onchange: choose },
        Object.entries(AXES).map(([name, a]) => el("option", { value: name, selected: name === axis }, a.title)))),
    unplaced.length ? el("p", { class: "muted small", id: "compare-x-note" },
      `Not on this axis (no time/progress point to place their steps by): ${unplaced.map(label).join(", ")}`) : null);
}

function render(runs, points, charts, axis = "step") {
  const keys = orderKeys(new Set(points.flat().map((p) => p.key)));
  const xOf = points.map((runPoints) => AXES[axis].of(runPoints));
  const unplaced = runs.filter((_run, r) => points[r].length && !points[r].some((p) => xOf[r](p) !== null));
  // A run keeps its colour on every chart, whichever other runs reported that key.
  const colors = new Map(runs.map((run, r) => [label(run), COLORS[r % COLORS.length]]));
  keys.forEach((key, i) => {
    const chart = new MetricChart({ id: `compare-${i}`, title: key, xLabel: AXES[axis].label,
      colorOf: (series) => colors.get(series) });
    chart.figure.dataset.key = key;
    chart.figure.dataset.x = axis;
    runs.forEach((run, r) => {
      for (const p of points[r]) {
        const x = p.key === key ? xOf[r](p) : null;
        if (x !== null && Number.isFinite(x)) chart.add(label(run), x, p.value);
      }
    });
    charts.push(chart);
  });
  const header = el("tr", {}, el("th", { scope: "col" }, ""), runs.map((run) => el("th", { scope: "col" },
    el("a", { href: `#/runs/${encodeURIComponent(run.id)}` }, run.name), " ", statusBadge(run.status),
    el("div", { class: "muted mono small" }, run.id))));
  const diff = specDiff(runs.map((r) => r.spec));
  const diffRows = Object.entries(diff).map(([path, values]) => el("tr", { dataset: { path } },
    el("th", { scope: "row", class: "mono" }, path),
    values.map((v) => el("td", { class: "mono" }, v === null ? "–" : JSON.stringify(v)))));
  const metricKeys = orderKeys(new Set(runs.flatMap((r) => [...Object.keys(r.summary), ...Object.keys(r.best)])));
  const summaryRows = metricKeys.map((key) => el("tr", { dataset: { key } },
    el("th", { scope: "row", class: "mono" }, key),
    runs.map((run) => summaryCell(run, key))));
  const measured = charts.filter((c) => !isBookkeeping(c.figure.dataset.key));
  const books = charts.filter((c) => isBookkeeping(c.figure.dataset.key));
  return [
    el("section", { "aria-labelledby": "compare-charts-h" }, el("h2", { id: "compare-charts-h" }, "Curves"),
      axisPicker(runs, axis, unplaced),
      measured.length ? el("div", { class: "chart-grid" }, measured.map((c) => c.figure))
        : el("p", { class: "muted" }, `None of these runs reported ${keys.length ? "a training metric" : "metrics"}.`),
      books.length ? el("details", { id: "compare-all-keys" },
        el("summary", {}, `Show all keys: ${books.length} more (${books.map((c) => c.figure.dataset.key).join(", ")})`),
        el("div", { class: "chart-grid" }, books.map((c) => c.figure))) : null),
    el("section", { "aria-labelledby": "compare-diff-h" }, el("h2", { id: "compare-diff-h" }, "Spec differences"),
      diffRows.length ? el("div", { class: "table-wrap" }, el("table", { id: "spec-diff", class: "compare-table" },
        el("thead", {}, header.cloneNode(true)), el("tbody", {}, diffRows)))
        : el("p", { class: "muted", id: "spec-diff-none" }, "The specs are identical.")),
    el("section", { "aria-labelledby": "compare-summary-h" }, el("h2", { id: "compare-summary-h" }, "Summaries"),
      el("div", { class: "table-wrap" }, el("table", { id: "compare-summary", class: "compare-table" },
        el("thead", {}, header), el("tbody", {}, summaryRows)))),
  ];
}
