// The API key: entered once, kept in localStorage. A URL fragment "#key=..." (for a link
// printed by `canopy up`) is taken too once its reader agrees, and removed from the address bar
// at once. Only the fragment: browsers never send it, whereas a key in the query ("?key=...")
// would reach the server, its logs and proxies; such a link is not honoured (the API refuses keys
// there too).

import { storage, visible } from "./dom.js";

const KEY = "canopy:api-key";

export function apiKey() {
  return storage.get(KEY);
}

export function saveKey(key) {
  storage.set(KEY, key);
}

export function forgetKey() {
  storage.set(KEY, null);
}

/**
 * The key a "#key=..." link carries, scrubbed from the URL at once; not saved: its reader is asked
 * first (``confirmLinkKey``), since a link can carry anyone's key and what is typed then goes to
 * that key's conversations. Null when there is none, or when a key is saved already (a link never
 * replaces it: sign out first to use another key's link).
 */
export function keyFromUrl() {
  const url = new URL(window.location.href);
  const key = new URLSearchParams(url.hash.replace(/^#\/?/, "")).get("key");
  if (!key) return null;
  history.replaceState(null, "", url.pathname + url.search);
  return apiKey() ? null : key;
}

/** Ask whether to sign in with a link's key, naming whose it is (``who``: GET /me); true to use it. */
export function confirmLinkKey(who) {
  const dialog = document.getElementById("link-key-dialog");
  document.getElementById("link-key-who").textContent =
    `user ${visible(String(who.user_id))} of app ${visible(String(who.app_id))}`;
  dialog.showModal();
  return new Promise((resolve) => {
    const answer = (use) => {
      dialog.close();
      resolve(use);
    };
    document.getElementById("link-key-accept").addEventListener("click", () => answer(true), { once: true });
    document.getElementById("link-key-decline").addEventListener("click", () => answer(false), { once: true });
    dialog.addEventListener("cancel", (event) => {
      event.preventDefault();
      answer(false);
    }, { once: true });
  });
}

/**
 * Ask for a key until one works. ``check(key)`` rejects for a bad key.
 * Resolves with the accepted key.
 */
export function askForKey(check, reason = "") {
  const dialog = document.getElementById("login-dialog");
  const form = document.getElementById("login-form");
  const input = document.getElementById("login-key");
  const error = document.getElementById("login-error");
  const submit = document.getElementById("login-submit");
  const showError = (text) => {
    error.textContent = text;
    error.hidden = !text;
  };
  showError(reason);
  input.value = "";
  if (!dialog.open) dialog.showModal();
  input.focus();
  return new Promise((resolve) => {
    const onSubmit = async (event) => {
      event.preventDefault();
      const key = input.value.trim();
      if (!key) return;
      submit.disabled = true;
      showError("");
      try {
        await check(key);
        saveKey(key);
        form.removeEventListener("submit", onSubmit);
        dialog.removeEventListener("cancel", onCancel);
        dialog.close();
        resolve(key);
      } catch (failure) {
        showError(failure?.status === 401 || failure?.status === 403
          ? "This key was not accepted." : `Could not check the key: ${failure?.message ?? failure}`);
      } finally {
        submit.disabled = false;
      }
    };
    const onCancel = (event) => event.preventDefault(); // there is nothing to show without a key
    form.addEventListener("submit", onSubmit);
    dialog.addEventListener("cancel", onCancel);
  });
}
