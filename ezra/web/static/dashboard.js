// EZRA dashboard: refresh <main> in place every few seconds, and ask before a destructive button.
"use strict";

document.addEventListener("submit", (event) => {
  const question = event.target.dataset.confirm;
  if (question && !window.confirm(question)) event.preventDefault();
});

const seconds = Number(document.body.dataset.refresh || 0);
if (seconds > 0) {
  setInterval(async () => {
    if (document.hidden || document.activeElement?.closest("form")) return;
    try {
      const response = await fetch(window.location.href, { credentials: "same-origin" });
      if (!response.ok) return;
      const fresh = new DOMParser().parseFromString(await response.text(), "text/html");
      for (const part of ["header", "main"]) {
        const now = document.querySelector(part), next = fresh.querySelector(part);
        if (now && next) now.replaceWith(next);
      }
    } catch (error) {
      console.warn("EZRA dashboard: refresh failed", error);
    }
  }, seconds * 1000);
}
