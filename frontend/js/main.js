// Bootstrap and routing.
//   #/                       nothing selected
//   #/new                    the New session page
//   #/s/<root_id>            a root's workspace
//   #/s/<root_id>/m/<id>     … with member <id> opened in a tab (origin links across roots)
// Workspaces are kept (a few, least recently used first to go) so that switching roots
// keeps each one's tabs, drafts and scroll positions.

import { Api } from "./api.js";
import { apiKey, askForKey, confirmLinkKey, forgetKey, keyFromUrl, saveKey } from "./auth.js";
import { h } from "./dom.js";
import { NewSessionPage } from "./newSession.js";
import { notify } from "./notify.js";
import { SessionList } from "./sessionList.js";
import { Store } from "./store.js";
import { initTheme } from "./theme.js";
import { timelines } from "./timeline.js";
import { Workspace } from "./workspace.js";

const KEEP_WORKSPACES = 6;
const AGENTS_TTL_MS = 30_000;

const host = document.getElementById("workspace-host");
const app = document.getElementById("app");
const scrim = document.getElementById("sidebar-scrim");
const apiBase = document.querySelector('meta[name="canopy-api-base"]')?.content || "/api/v1";

let relogging = null;
const api = new Api({ base: apiBase, getKey: apiKey, onUnauthorized: () => relogin("Your API key was not accepted.") });
const store = new Store(api);
const workspaces = new Map();
let current = null; // the page shown: a Workspace, the NewSessionPage or the empty page
let newPage = null;
let sessionList = null;
let agentsCache = { at: 0, list: null };

function openSidebar() {
  app.classList.add("sidebar-open");
  scrim.hidden = false;
}

function closeSidebar() {
  app.classList.remove("sidebar-open");
  scrim.hidden = true;
}
scrim.addEventListener("click", closeSidebar);
document.addEventListener("keydown", (event) => {
  if (event.key === "Escape" && app.classList.contains("sidebar-open")) closeSidebar();
});

const ctx = {
  api,
  store,
  notify,
  navigate(hash) {
    if (window.location.hash === hash) route();
    else window.location.hash = hash;
  },
  async loadAgents() {
    if (!agentsCache.list || Date.now() - agentsCache.at > AGENTS_TTL_MS) {
      agentsCache = { at: Date.now(), list: await api.agents() };
    }
    return agentsCache.list;
  },
  menuButton(extra = "") {
    return h("button", { class: `icon-btn menu-btn ${extra}`, type: "button", text: "☰", title: "Conversations",
      "aria-label": "Show the conversations", onClick: openSidebar });
  },
  projectId: () => sessionList?.projectId ?? null,
  rootsChanged: () => sessionList?.scheduleRefresh(),
  relogin: () => relogin(""),
  async archive(rootId, title) {
    try {
      await api.archive(rootId);
      notify(`Archived “${title}”. Nothing was deleted.`);
      sessionList.remove(rootId);
      const workspace = workspaces.get(rootId);
      if (workspace) {
        if (current === workspace) ctx.navigate("#/");
        workspaces.delete(rootId);
        workspace.deactivate();
        workspace.destroy();
      }
      sessionList.refresh();
    } catch (error) {
      notify(error.status === 409
        ? `“${title}” cannot be archived yet: something in its tree is still running, waiting, queued or being `
          + `cleaned up. Use Stop all (or let the work finish), then archive. — ${error.message}`
        : `Could not archive “${title}”: ${error.message}`, "error");
    }
  },
};

function emptyPage() {
  return {
    el: h("section", { class: "empty-page" },
      h("header", { class: "main-head" }, ctx.menuButton(), h("h1", { class: "root-title", text: "Canopy" })),
      h("div", { class: "empty-body" },
        h("p", {}, "Pick a conversation ",
          h("span", { class: "wide-only", text: "in the list on the left" }),
          h("span", { class: "narrow-only", text: "from the list behind the ☰ menu button at the top left" }),
          ", or start a new one."),
        h("a", { class: "btn primary", href: "#/new", text: "New session" }))),
    activate() {},
    deactivate() {},
  };
}
const empty = emptyPage();

function workspaceFor(rootId) {
  let workspace = workspaces.get(rootId);
  if (workspace) workspaces.delete(rootId); // re-insert: most recently used last
  else workspace = new Workspace({ ctx, rootId });
  workspaces.set(rootId, workspace);
  for (const [id, old] of workspaces) {
    if (workspaces.size <= KEEP_WORKSPACES) break;
    if (old === current || old === workspace) continue;
    workspaces.delete(id);
    old.destroy();
  }
  return workspace;
}

function show(page) {
  if (current === page) return;
  current?.deactivate();
  current?.el.remove();
  current = page;
  host.replaceChildren(page.el);
  page.activate();
}

/** A route's part as it was encoded, or null for one that cannot be decoded (a hand-made "%E0"). */
function decoded(part) {
  try {
    return decodeURIComponent(part);
  } catch {
    return null;
  }
}

function route() {
  closeSidebar();
  const parts = window.location.hash.replace(/^#\/?/, "").split("/").filter(Boolean).map(decoded);
  if (parts.includes(null)) parts.length = 0; // the start page, not a blank one
  if (parts[0] === "new") {
    newPage ??= new NewSessionPage({ ctx });
    show(newPage);
    document.title = "New session · Canopy";
    sessionList?.setActive(null);
    return;
  }
  if (parts[0] === "s" && parts[1]) {
    const rootId = parts[1];
    const workspace = workspaceFor(rootId);
    show(workspace);
    sessionList?.setActive(rootId);
    if (parts[2] === "m" && parts[3]) {
      workspace.openSession(parts[3]);
      history.replaceState(null, "", `#/s/${encodeURIComponent(parts[1])}`);
    }
    return;
  }
  show(empty);
  document.title = "Canopy";
  sessionList?.setActive(null);
}

async function relogin(reason) {
  if (relogging) return relogging;
  forgetKey();
  relogging = askForKey((key) => api.checkKey(key), reason).then(() => window.location.reload());
  return relogging;
}

/** Whose key this browser uses, in the sidebar. */
async function showIdentity(known) {
  try {
    sessionList.showIdentity(known ?? await api.me());
  } catch {
    /* the sidebar says nothing; the key's own checks go on as before */
  }
}

/** Whose key a link carries, and the reader's answer: the key's owner (GET /me) when taken, else null. */
async function signInByLink(key) {
  let who;
  try {
    who = await api.checkKey(key);
  } catch {
    return null; // a link whose key is not accepted: asked for one as without a link
  }
  if (!await confirmLinkKey(who)) return null;
  saveKey(key);
  return who;
}

async function boot() {
  initTheme();
  // The check of a key is GET /me: whose key it is comes with the check, not a second request.
  let me = null;
  const check = async (key) => {
    me = await api.checkKey(key);
  };
  const linkKey = keyFromUrl();
  if (linkKey) me = await signInByLink(linkKey);
  if (!me && !apiKey()) {
    await askForKey(check);
  } else if (!me) {
    try {
      await check(apiKey());
    } catch (error) {
      if (error.status === 401 || error.status === 403) {
        forgetKey();
        await askForKey(check, "The saved API key was not accepted.");
      }
    }
  }
  sessionList = new SessionList({ ctx });
  document.getElementById("sidebar").append(sessionList.el);
  showIdentity(me);
  sessionList.start();
  window.addEventListener("hashchange", route);
  route();
  document.body.dataset.ready = "true";
}

// A handle for debugging in the console and for the browser tests.
window.canopy = { api, store, workspaces, timelines };

boot();
