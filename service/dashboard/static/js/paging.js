// Paging a newest-first list (GET /runs, GET /sweeps) with the API's keyset cursor: each page
// is `{data, next_cursor}`, and `cursor=<next_cursor>` asks for the page after it (null: the
// last page). The view shows the first page and any older pages the user asked for ("Show
// older …"), and keeps all of them live:
//
// - Every poll revalidates the first page: one conditional GET (ETag; a 304 costs nothing).
// - The older pages are read again as a chain, page k+1 with the next_cursor the fresh page k
//   just gave, whenever the first page's next_cursor moved (new items pushed some off it, or
//   some left it), and otherwise every OLDER_EVERY polls, so that their rows' status stays
//   current without a request per loaded page on every poll.
//
// The chain keeps the same stretch of items, not the same number of pages: it is read until the
// page that holds the oldest item shown (new items push that one onto a later page), and the
// items after it on that page stay hidden until "Show older" reveals them, so that new items
// never push a loaded row out of view, nor pull a page's worth of older rows into it. The chain
// reads at most CHAIN_SLACK pages more than were loaded; where the oldest item is not found
// within them (it was deleted, archived, or left the filter), the view ends at the oldest
// earlier-shown item the chain did find, or else keeps as many pages as before.
//
// Reading the chain from the fresh first page means the pages always cover one unbroken stretch
// of the newest items: when new ones arrive and shift the pages, no item falls into a gap and
// none shows twice. `items` drops a repeated id anyway (keeping its first, newest, place), so the
// table can key its rows by id whatever the API does between two requests.
//
// Polls and "show older" go through one queue, so they never interleave their pages.

import { errorText, getIfChanged } from "./api.js";
import { el, setText, TERMINAL } from "./ui.js";

const OLDER_EVERY = 5;
const CHAIN_SLACK = 2;

export class PagedList {
  /**
   * `path`: the first page's API path with its filters and `limit` (it has a `?`). `get`: how a
   * page is read, `getIfChanged` of ./api.js (the same object again for an unchanged page).
   */
  constructor(path, { olderEvery = OLDER_EVERY, get = getIfChanged } = {}) {
    this.path = path;
    this.olderEvery = olderEvery;
    this.get = get;
    this.pages = []; // [{data, next_cursor}], the first page first; empty until the first poll
    this.shownOfLast = null; // how many of the last page's items are shown (null: all of them)
    this.polls = 0;
    this.queue = Promise.resolve();
  }

  /** Whether there are items older than those shown (hidden on the last page, or past it). */
  get hasOlder() {
    const last = this.pages.at(-1);
    return Boolean(last?.next_cursor) || (this.shownOfLast !== null && this.shownOfLast < last.data.length);
  }

  /** The shown items of the loaded pages, newest first, each id once. */
  get items() { return shownItems(this.pages, this.shownOfLast); }

  /** One poll (see above); resolves to whether the items shown may have changed. */
  poll() { return this._serial(() => this._poll()); }

  /**
   * Show the items older than those shown: the hidden rest of the last page and the page after it
   * (if any). Resolves to whether any was added.
   */
  loadOlder() { return this._serial(() => this._loadOlder()); }

  _serial(task) {
    const run = this.queue.then(task);
    this.queue = run.catch(() => {}); // a failed step must not block the next one
    return run;
  }

  _pageUrl(cursor) { return `${this.path}&cursor=${encodeURIComponent(cursor)}`; }

  async _poll() {
    const before = this.pages;
    const shownBefore = this.shownOfLast;
    const { data: first } = await this.get(this.path);
    this.polls += 1;
    const moved = before.length > 0 && first.next_cursor !== before[0].next_cursor;
    let pages = [first, ...before.slice(1)];
    let shown = before.length > 1 ? shownBefore : null;
    if (before.length > 1 && (moved || this.polls % this.olderEvery === 0)) {
      ({ pages, shown } = await this._chain(first, before, shownBefore));
    }
    this.pages = pages;
    this.shownOfLast = shown;
    // getIfChanged answers a 304 with the very object it returned before: identity says "unchanged".
    return pages.length !== before.length || shown !== shownBefore ||
      pages.some((page, index) => page !== before[index]);
  }

  /**
   * The pages from `first` on that hold the items shown from `before` (see above): `{pages,
   * shown}`, `shown` as `shownOfLast`.
   */
  async _chain(first, before, shownBefore) {
    const earlier = shownItems(before, shownBefore).map((item) => item.id);
    const oldest = earlier.at(-1);
    const pages = [first];
    while (!pages.at(-1).data.some((item) => item.id === oldest) && pages.at(-1).next_cursor &&
           pages.length < before.length + CHAIN_SLACK) {
      pages.push((await this.get(this._pageUrl(pages.at(-1).next_cursor))).data);
    }
    // End at the oldest item shown, or else at the oldest earlier-shown item found.
    const wanted = pages.at(-1).data.some((item) => item.id === oldest) ? new Set([oldest]) : new Set(earlier);
    for (let p = pages.length - 1; p >= 0; p -= 1) {
      const index = pages[p].data.findLastIndex((item) => wanted.has(item.id));
      if (index < 0) continue;
      if (p === 0) return { pages: pages.slice(0, 1), shown: null }; // the first page is always shown whole
      return { pages: pages.slice(0, p + 1), shown: index + 1 < pages[p].data.length ? index + 1 : null };
    }
    return { pages: pages.slice(0, before.length), shown: null }; // none found: as many pages as before
  }

  async _loadOlder() {
    if (!this.hasOlder) return false;
    const last = this.pages.at(-1);
    const older = last.next_cursor ? [(await this.get(this._pageUrl(last.next_cursor))).data] : [];
    this.pages = [...this.pages, ...older];
    this.shownOfLast = null;
    return true;
  }
}

/** The items of `pages` newest first, each id once, of the last page only its first `shownOfLast`. */
function shownItems(pages, shownOfLast) {
  const seen = new Set();
  const items = [];
  pages.forEach((page, index) => {
    const data = index === pages.length - 1 && shownOfLast !== null ? page.data.slice(0, shownOfLast) : page.data;
    for (const item of data) {
      if (seen.has(item.id)) continue;
      seen.add(item.id);
      items.push(item);
    }
  });
  return items;
}

/**
 * The "Show older …" button under a list's table (shown while `list.hasOlder`), and the line
 * that says why loading failed. Once a page has come, `render(list.items)` redraws the table,
 * and when nothing older is left (the button, which had the focus, goes away) the focus moves
 * to the link of the first row just loaded, in `rows` (the table's body). Returns `{element,
 * update}`: call `update()` after each render.
 *
 * While a page loads the button says so and is aria-disabled (clicks are ignored), not
 * `disabled`: a disabled button loses the focus to the page's body, and a keyboard user who
 * pressed it should be able to press it again once the page has come.
 */
export function olderButton(list, { id, label, noun, rows, render }) {
  const problem = el("p", { class: "field-error", id: `${id}-error`, role: "alert", hidden: true });
  let busy = false;
  const button = el("button", { type: "button", id, class: "show-older", hidden: true, onclick: async () => {
    if (busy) return;
    busy = true;
    const before = list.items.length;
    button.setAttribute("aria-disabled", "true");
    setText(button, "Loading…");
    try {
      if (await list.loadOlder()) {
        render(list.items);
        if (!list.hasOlder) rows.children[before]?.querySelector("a")?.focus();
      }
      problem.hidden = true;
    } catch (error) {
      setText(problem, `Could not load older ${noun}: ${errorText(error)}. Try again.`);
      problem.hidden = false;
    } finally {
      busy = false;
      button.removeAttribute("aria-disabled");
      setText(button, label);
      update();
    }
  } }, label);
  function update() { button.hidden = !list.hasOlder; }
  return { element: el("div", { class: "show-older-box" }, button, problem), update };
}

/** The count line under a list's filters: "12 runs, 3 not finished"; with more behind the last
 *  page loaded, that the count is of the newest only ("Newest 100 runs shown…; older runs not loaded"). */
export function shownCount(list, noun) {
  const items = list.items;
  const active = items.filter((item) => !TERMINAL.has(item.status)).length;
  const nouns = `${noun}${items.length === 1 ? "" : "s"}`;
  const unfinished = active ? `, ${active} not finished` : "";
  return list.hasOlder ? `Newest ${items.length} ${nouns} shown${unfinished}; older ${noun}s not loaded`
    : `${items.length} ${nouns}${unfinished}`;
}
