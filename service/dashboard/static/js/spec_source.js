// Where a field is in the spec text the user typed: maps the API's dotted field paths
// (`optimizer.lr`, `algorithms[2].name`) to line numbers, using js-yaml's event stream, which
// carries source offsets. JSON is YAML, so the same walk covers both.

import { EVENT_ID, getScalarValue, parseEvents } from "../vendor/js-yaml.mjs";

/** `Map(path -> 1-based line)` of every mapping key and sequence item in `source`. */
export function fieldLines(source) {
  let events;
  try {
    events = parseEvents(source, {});
  } catch {
    return new Map(); // unparseable text has no fields to point at
  }
  const lineStarts = [0];
  for (let i = 0; i < source.length; i += 1) if (source[i] === "\n") lineStarts.push(i + 1);
  const lineOf = (offset) => {
    let lo = 0;
    let hi = lineStarts.length - 1;
    while (lo < hi) {
      const mid = (lo + hi + 1) >> 1;
      if (lineStarts[mid] <= offset) lo = mid; else hi = mid - 1;
    }
    return lo + 1;
  };
  const startOf = (event) => (event.type === EVENT_ID.SCALAR ? event.valueStart : event.start ?? -1);

  const lines = new Map();
  let i = 0;
  // Consume the node at events[i] (and its children), recording paths below `path`.
  function walk(path) {
    const event = events[i++];
    if (event.type === EVENT_ID.MAPPING) {
      while (events[i].type !== EVENT_ID.POP) {
        const keyEvent = events[i];
        const key = keyEvent.type === EVENT_ID.SCALAR ? getScalarValue(source, keyEvent) : null;
        walk(null); // the key itself
        const child = key === null ? null : path ? `${path}.${key}` : key;
        if (child !== null && keyEvent.valueStart >= 0) lines.set(child, lineOf(keyEvent.valueStart));
        walk(child);
      }
      i += 1;
    } else if (event.type === EVENT_ID.SEQUENCE) {
      let index = 0;
      while (events[i].type !== EVENT_ID.POP) {
        const child = path === null ? null : `${path}[${index}]`;
        const start = startOf(events[i]);
        if (child !== null && start >= 0) lines.set(child, lineOf(start));
        walk(child);
        index += 1;
      }
      i += 1;
    }
  }
  while (i < events.length) {
    if (events[i].type === EVENT_ID.DOCUMENT) {
      i += 1;
      while (i < events.length && events[i].type !== EVENT_ID.POP) walk("");
      i += 1;
    } else {
      i += 1;
    }
  }
  return lines;
}

/**
 * The line to show an error for `field` next to: the field's own line, else that of its
 * nearest parent that is in the text (a missing `optimizer.lr` points at `optimizer`).
 * Returns `{line, exact}`, or null when nothing of the path is in the text.
 */
export function locateField(lines, field) {
  let path = field;
  let exact = true;
  while (path) {
    if (lines.has(path)) return { line: lines.get(path), exact };
    exact = false;
    const cut = Math.max(path.lastIndexOf("."), path.lastIndexOf("["));
    path = cut > 0 ? path.slice(0, cut) : "";
  }
  return null;
}
