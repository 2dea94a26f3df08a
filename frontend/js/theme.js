// Light and dark themes: CSS custom properties switched by <html data-theme>. The choice is
// kept in localStorage; with no choice the system preference decides (and is followed live).

import { h, storage } from "./dom.js";

const KEY = "canopy:theme";
const media = window.matchMedia("(prefers-color-scheme: dark)");

export function currentTheme() {
  return document.documentElement.dataset.theme === "dark" ? "dark" : "light";
}

export function setTheme(theme, { save = true } = {}) {
  document.documentElement.dataset.theme = theme;
  if (save) storage.set(KEY, theme);
  for (const button of document.querySelectorAll("[data-theme-toggle]")) label(button);
}

function label(button) {
  const next = currentTheme() === "dark" ? "light" : "dark";
  button.textContent = next === "dark" ? "☾" : "☀";
  button.title = `Switch to the ${next} theme`;
  button.setAttribute("aria-label", button.title);
}

export function initTheme() {
  const saved = storage.get(KEY);
  setTheme(saved ?? (media.matches ? "dark" : "light"), { save: false });
  media.addEventListener("change", (event) => {
    if (!storage.get(KEY)) setTheme(event.matches ? "dark" : "light", { save: false });
  });
}

export function themeToggle() {
  const button = h("button", {
    class: "icon-btn",
    type: "button",
    "data-theme-toggle": true,
    onClick: () => setTheme(currentTheme() === "dark" ? "light" : "dark"),
  });
  label(button);
  return button;
}
