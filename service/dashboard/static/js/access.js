// Who is looking: GET /me gives the key's projects and roles. The header gets a project
// switcher, and <body data-role> says the key's role in the chosen project, so CSS hides the
// actions (elements marked data-needs="member") that the role may not take. A page about one
// run or sweep marks itself with the key's role in that record's own project
// (`scopeRole`, data-project-role), which wins over the body's inside the page.

import { currentProject, getJSON, setCurrentProject } from "./api.js";

const RANK = { viewer: 0, member: 1, admin: 2 };
let me = null;

/** The highest role of the key's roles in the projects `matches` accepts ('*' is every project); null if none. */
function highestRole(matches) {
  const roles = Object.entries(me.roles).filter(([name]) => name === "*" || matches(name)).map(([, role]) => role);
  return roles.sort((a, b) => RANK[b] - RANK[a])[0] || null;
}

/** The key's role in the chosen project (the highest of its roles when "all" is chosen). */
export function currentRole() {
  if (!me) return null;
  const project = currentProject();
  return highestRole((name) => !project || name === project);
}

/** The key's role in `project` ("viewer" where it has none); null until /me has answered. */
export function roleIn(project) {
  if (!me) return null;
  return highestRole((name) => name === project) || "viewer";
}

/**
 * Mark `element` (a run's or a sweep's page) with the key's role in `project`, the record's own
 * project: inside it, CSS shows the data-needs="member" actions by that role, not by the switcher's.
 */
export function scopeRole(element, project) {
  const role = roleIn(project || "default");
  if (role) element.dataset.projectRole = role;
  else delete element.dataset.projectRole; // /me did not answer: the body's role applies
}

function paint(select) {
  const projects = me.projects.map((p) => p.name);
  if (currentProject() && !projects.includes(currentProject())) setCurrentProject("");
  select.replaceChildren(new Option("All projects", ""), ...projects.map((name) => new Option(name, name)));
  select.value = currentProject();
  document.body.dataset.role = currentRole() || "viewer";
}

/** Load /me and keep the switcher and the role in step; `onChange` re-renders the view. */
export async function setUpAccess(select, onChange) {
  select.addEventListener("change", () => {
    setCurrentProject(select.value);
    document.body.dataset.role = currentRole() || "viewer";
    onChange();
  });
  const load = async () => {
    me = await getJSON("/me");
    paint(select);
  };
  window.addEventListener("tessera:key", () => { load().then(onChange, () => {}); });
  await load();
}
