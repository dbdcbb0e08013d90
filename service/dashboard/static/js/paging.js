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
// Reading the chain from the fresh first page means the pages always cover one unbroken stretch
// of the newest items: when new ones arrive and shift the pages, no item falls into a gap and
// none shows twice. `items` drops a repeated id anyway (keeping its first, newest, place), so the
// table can key its rows by id whatever the API does between two requests.
//
// Polls and "show older" go through one queue, so they never interleave their pages.

import { errorText, getIfChanged } from "./api.js";
import { el, setText } from "./ui.js";

const OLDER_EVERY = 5;

export class PagedList {
  /** `path`: the first page's API path with its filters and `limit` (it has a `?`). */
  constructor(path, { olderEvery = OLDER_EVERY } = {}) {
    this.path = path;
    this.olderEvery = olderEvery;
    this.pages = []; // [{data, next_cursor}], the first page first; empty until the first poll
    this.polls = 0;
    this.queue = Promise.resolve();
  }

  /** Whether there are items older than the pages loaded (the last page has a next_cursor). */
  get hasOlder() { return Boolean(this.pages.at(-1)?.next_cursor); }

  /** The loaded pages' items, newest first, each id once. */
  get items() {
    const seen = new Set();
    const items = [];
    for (const page of this.pages) {
      for (const item of page.data) {
        if (seen.has(item.id)) continue;
        seen.add(item.id);
        items.push(item);
      }
    }
    return items;
  }

  /** One poll (see above); resolves to whether any loaded page changed. */
  poll() { return this._serial(() => this._poll()); }

  /** Read the page after the last one loaded and append it; resolves to whether one was added. */
  loadOlder() { return this._serial(() => this._loadOlder()); }

  _serial(task) {
    const run = this.queue.then(task);
    this.queue = run.catch(() => {}); // a failed step must not block the next one
    return run;
  }

  _pageUrl(cursor) { return `${this.path}&cursor=${encodeURIComponent(cursor)}`; }

  async _poll() {
    const before = this.pages;
    const { data: first } = await getIfChanged(this.path);
    this.polls += 1;
    const moved = before.length > 0 && first.next_cursor !== before[0].next_cursor;
    let pages = [first, ...before.slice(1)];
    if (before.length > 1 && (moved || this.polls % this.olderEvery === 0)) pages = await this._chain(first, before.length);
    this.pages = pages;
    // getIfChanged answers a 304 with the very object it returned before: identity says "unchanged".
    return pages.length !== before.length || pages.some((page, index) => page !== before[index]);
  }

  /** The first `count` pages, read from `first` on (fewer where the list ends sooner). */
  async _chain(first, count) {
    const pages = [first];
    while (pages.length < count && pages.at(-1).next_cursor) {
      pages.push((await getIfChanged(this._pageUrl(pages.at(-1).next_cursor))).data);
    }
    return pages;
  }

  async _loadOlder() {
    const cursor = this.pages.at(-1)?.next_cursor;
    if (!cursor) return false;
    const { data } = await getIfChanged(this._pageUrl(cursor));
    this.pages = [...this.pages, data];
    return true;
  }
}

/**
 * The "Show older …" button under a list's table (shown while `list.hasOlder`), and the line
 * that says why loading failed. `onLoaded(before)` re-renders the list; `before` is how many
 * items were shown, i.e. the index of the first one just loaded (to move the focus to it once
 * the button, which had it, goes away). Returns `{element, update}`: call `update()` after each
 * render.
 */
export function olderButton(list, { id, label, noun, onLoaded }) {
  const problem = el("p", { class: "field-error", id: `${id}-error`, role: "alert", hidden: true });
  const button = el("button", { type: "button", id, class: "show-older", hidden: true, onclick: async () => {
    const before = list.items.length;
    button.disabled = true;
    setText(button, "Loading…");
    try {
      if (await list.loadOlder()) onLoaded(before);
      problem.hidden = true;
    } catch (error) {
      setText(problem, `Could not load older ${noun}: ${errorText(error)}. Try again.`);
      problem.hidden = false;
    } finally {
      button.disabled = false;
      setText(button, label);
      update();
    }
  } }, label);
  function update() { button.hidden = !list.hasOlder; }
  return { element: el("div", { class: "show-older-box" }, button, problem), update };
}
