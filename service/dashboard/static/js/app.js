// The dashboard's shell: a hash router over one module per view, the navigation, and the
// "Live / Stale" badge that every polling view reports to.
//
// Adding a view: write `<view>.js` exporting `mount(root, ctx) -> cleanup`, add its routes
// below and a link to index.html's <nav>.

import { setUpAccess } from "./access.js";
import * as algorithmsView from "./algorithms.js";
import * as compareView from "./compare.js";
import * as runView from "./run.js";
import * as runsView from "./runs.js";
import * as submitView from "./submit.js";
import * as sweepView from "./sweep.js";
import * as sweepsView from "./sweeps.js";
import { formatClock, formatDuration } from "./ui.js";

const ROUTES = [
  { pattern: /^\/runs$/, nav: "runs", view: runsView },
  { pattern: /^\/runs\/([^/]+)$/, nav: "runs", view: runView },
  { pattern: /^\/compare$/, nav: "runs", view: compareView },
  { pattern: /^\/sweeps$/, nav: "sweeps", view: sweepsView },
  { pattern: /^\/sweeps\/([^/]+)$/, nav: "sweeps", view: sweepView },
  { pattern: /^\/algorithms$/, nav: "algorithms", view: algorithmsView },
  { pattern: /^\/submit$/, nav: "submit", view: submitView },
];
const DEFAULT_ROUTE = "#/runs";

// Poll interval: 3 s, or `?poll_ms=N` in the page URL (tests use a shorter one).
const pageParams = new URLSearchParams(window.location.search);
const POLL_MS = Math.max(250, Number(pageParams.get("poll_ms")) || 3000);

const main = document.getElementById("main");
const liveBadge = document.getElementById("live");
// The badge's time changes every poll; screen readers hear only changes of state.
const announcer = document.getElementById("live-announcer");
const ANNOUNCEMENTS = { live: "Live updates", stale: "Updates failing, retrying", stopped: "Updates stopped" };
let cleanup = null;

function setLive(state) {
  const before = liveBadge.dataset.state;
  paintLive(state);
  const after = liveBadge.dataset.state;
  if (after !== before && after !== "idle" && !(before === "idle" && after === "live")) {
    announcer.textContent = ANNOUNCEMENTS[after];
  }
}

function paintLive(state) {
  liveBadge.title = "";
  if (!state) {
    liveBadge.dataset.state = "idle";
    liveBadge.textContent = "";
    return;
  }
  const at = state.at ? formatClock(state.at) : "never";
  if (state.ok) {
    liveBadge.dataset.state = "live";
    liveBadge.textContent = `● Live · updated ${at}`;
  } else if (state.stopped) {
    liveBadge.dataset.state = "stopped";
    liveBadge.textContent = `⚠ Not updating: ${state.error.message}`;
  } else {
    liveBadge.dataset.state = "stale";
    liveBadge.textContent = `⚠ Stale · last update ${at} · retrying in ${formatDuration(state.retryInMs)}`;
    liveBadge.title = state.error.message;
  }
}

function parseHash() {
  const hash = window.location.hash.startsWith("#/") ? window.location.hash.slice(1) : DEFAULT_ROUTE.slice(1);
  const [path, query = ""] = hash.split("?");
  return { path, query: new URLSearchParams(query) };
}

function route() {
  if (!window.location.hash.startsWith("#/")) {
    window.location.replace(DEFAULT_ROUTE);
    return;
  }
  const { path, query } = parseHash();
  if (cleanup) cleanup();
  cleanup = null;
  setLive(null);
  main.replaceChildren();
  let match = null;
  const found = ROUTES.find((r) => (match = path.match(r.pattern)));
  for (const link of document.querySelectorAll("[data-nav]")) {
    if (found && link.dataset.nav === found.nav) link.setAttribute("aria-current", "page");
    else link.removeAttribute("aria-current");
  }
  if (!found) {
    main.append(Object.assign(document.createElement("h1"), { textContent: "Page not found" }));
    return;
  }
  const ctx = { params: match.slice(1).map(decodeURIComponent), query, pollMs: POLL_MS, setLive };
  cleanup = found.view.mount(main, ctx) || null;
}

// Move keyboard focus to the new page's heading, so screen readers announce the change.
function focusHeading() {
  const heading = main.querySelector("h1");
  if (heading) {
    heading.tabIndex = -1;
    heading.focus({ preventScroll: true });
  }
}

window.addEventListener("hashchange", () => { route(); focusHeading(); });
document.querySelector(".skip-link").addEventListener("click", (event) => {
  event.preventDefault(); // "#main" is not a route
  main.focus();
});
setUpAccess(document.getElementById("project"), route).catch(() => {}).finally(route);
