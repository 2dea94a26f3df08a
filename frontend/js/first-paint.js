// Apply the saved theme before the first paint (no flash of the wrong theme). A classic script of
// its own, loaded before the page is drawn: the content policy (api/headers.py) runs no inline script.
(function () {
  var saved = null;
  try { saved = localStorage.getItem("canopy:theme"); } catch (e) { /* storage disabled */ }
  var dark = saved ? saved === "dark" : window.matchMedia("(prefers-color-scheme: dark)").matches;
  document.documentElement.dataset.theme = dark ? "dark" : "light";
})();
