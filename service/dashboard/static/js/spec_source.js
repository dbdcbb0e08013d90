// Where a field is in the spec text the user typed: maps the API's field paths (`optimizer.lr`,
// `algorithms[2].name`, a sweep's `search.params['optimizer.lr'].grid`) to line numbers, using
// js-yaml's event stream, which carries source offsets. JSON is YAML, so the same walk covers both.
//
// Paths are written as the API writes them (api/validation_errors.py `join_field`): a key that
// is a plain name after a dot, a list index as `[2]`, and any other key (a dot, a space, a
// leading digit in it) in brackets, quoted as Python's repr() quotes it, so that the dot in
// `search.params['optimizer.lr']` does not read as nesting.

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
        const child = key === null ? null : path === null ? null : path + keyPart(key, path === "");
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

const PLAIN_NAME = /^[A-Za-z_]\w*$/;

/** How `key` is appended to a path: `.key` (or `key` first), else `['a.b']`. */
function keyPart(key, first) {
  if (PLAIN_NAME.test(key)) return first ? key : `.${key}`;
  return `[${pythonRepr(key)}]`;
}

/** A string as Python's repr() writes it: single quotes, unless only double quotes avoid escaping. */
function pythonRepr(text) {
  const quote = text.includes("'") && !text.includes('"') ? '"' : "'";
  const escaped = text.replace(/[\\\x00-\x1f\x7f]/g, (c) => ({ "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t" }[c]
    ?? `\\x${c.charCodeAt(0).toString(16).padStart(2, "0")}`));
  return quote + escaped.replaceAll(quote, `\\${quote}`) + quote;
}

// One part of a field path as written: `name` or `.name`, `['quoted key']` or `["it's"]`, `[2]`,
// and `[key]` (the API's mark of a bad dict key, after that key).
const QUOTED = String.raw`'(?:[^'\\\n]|\\.)*'|"(?:[^"\\\n]|\\.)*"`;
const PART = new RegExp(String.raw`\.?[A-Za-z_]\w*|\[(?:${QUOTED})\]|\[\d+\]|\[key\]`, "y");

/** `field` cut into its parts as written (`search.params['a.b'].grid` → `search`, `.params`,
 *  `['a.b']`, `.grid`), each prefix of which is a path `fieldLines` may hold. Text from where
 *  it stops reading as a path on is one last part. */
function fieldParts(field) {
  const parts = [];
  PART.lastIndex = 0;
  while (PART.lastIndex < field.length) {
    const start = PART.lastIndex;
    const match = PART.exec(field);
    if (match === null) return [...parts, field.slice(start)];
    parts.push(match[0]);
  }
  return parts;
}

/**
 * The line to show an error for `field` next to: the field's own line, else that of its
 * nearest parent that is in the text (a missing `optimizer.lr` points at `optimizer`; a missing
 * `search.params['optimizer.lr'].grid` at the `optimizer.lr:` key of search.params).
 * Returns `{line, exact}`, or null when nothing of the path is in the text.
 */
export function locateField(lines, field) {
  const parts = fieldParts(field);
  if (parts.at(-1) === "[key]") parts.pop(); // a bad key: the key's own line is the place
  for (let n = parts.length; n > 0; n -= 1) {
    const path = parts.slice(0, n).join("");
    if (lines.has(path)) return { line: lines.get(path), exact: n === parts.length };
  }
  return null;
}
