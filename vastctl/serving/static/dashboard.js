// vastctl dashboard: refresh the live part of the page without a reload, and let a row's
// "kill…" button fill the kill form. No framework, no build step; the server escapes every value.
"use strict";

(function () {
  var live = document.getElementById("live");
  var stamp = document.getElementById("refreshed");
  if (!live) {
    return;
  }
  var every = parseInt(live.getAttribute("data-every"), 10);
  if (!(every > 0)) {
    return; // a past moment (--as-of, a kept demo day): nothing changes, the header says so
  }
  var busy = false;

  function say(text) {
    if (stamp) {
      stamp.textContent = text;
    }
  }

  // A detail view the operator opened (vast's message, the skipped steps) stays open across a refresh.
  function openDetails() {
    var keys = [];
    live.querySelectorAll("details[open][data-key]").forEach(function (element) {
      keys.push(element.getAttribute("data-key"));
    });
    return keys;
  }

  function reopen(keys) {
    live.querySelectorAll("details[data-key]").forEach(function (element) {
      if (keys.indexOf(element.getAttribute("data-key")) !== -1) {
        element.open = true;
      }
    });
  }

  function refresh() {
    if (busy || document.hidden) {
      return;
    }
    busy = true;
    fetch(live.getAttribute("data-src"), { credentials: "same-origin", cache: "no-store" })
      .then(function (response) {
        if (response.status === 401) {
          window.location.reload(); // signed out: show the sign-in form
          return null;
        }
        if (!response.ok) {
          throw new Error("HTTP " + response.status);
        }
        return response.text();
      })
      .then(function (html) {
        if (html !== null) {
          var open = openDetails();
          live.innerHTML = html; // server-rendered, every value escaped there
          reopen(open);
          say("updated " + new Date().toISOString().slice(11, 19) + " UTC"); // UTC, as every time on the page
        }
      })
      .catch(function (error) {
        say("refresh failed (" + error.message + "): retrying");
      })
      .then(function () {
        busy = false;
      });
  }

  document.addEventListener("click", function (event) {
    var button = event.target.closest("button[data-kill]");
    if (!button) {
      return;
    }
    var form = document.getElementById("kill-form");
    form.elements.instance.value = button.getAttribute("data-kill");
    form.elements.reason.focus();
    form.scrollIntoView({ block: "nearest" });
  });

  document.addEventListener("visibilitychange", refresh);
  window.setInterval(refresh, every);
  say("live, every " + Math.round(every / 1000) + "s");
})();
