// agentlife console: a running job's page refreshes itself while the job moves. Bounded polling: every
// few seconds, at most MAX_POLLS times, and only while the tab is visible; the page works without it.
"use strict";
(function () {
  var main = document.getElementById("main");
  if (!main || !main.dataset.live) { return; }
  var MAX_POLLS = 900, INTERVAL_MS = 2000, polls = 0, busy = false;
  var version = main.dataset.version;

  function editing() {
    var active = document.activeElement;
    return active && active.closest && active.closest("form") !== null;
  }

  function refresh() {
    return fetch(window.location.href, { credentials: "same-origin" })
      .then(function (r) { return r.ok ? r.text() : null; })
      .then(function (text) {
        if (text === null) { return; }
        var fresh = new DOMParser().parseFromString(text, "text/html").getElementById("main");
        if (!fresh) { return; }
        main.replaceChildren.apply(main, Array.prototype.slice.call(fresh.childNodes).map(function (n) {
          return document.importNode(n, true);
        }));
        version = fresh.dataset.version;
        if (!fresh.dataset.live) { delete main.dataset.live; }
        main.dataset.version = version || "";
      });
  }

  function poll() {
    if (!main.dataset.live || polls >= MAX_POLLS) { return; }
    polls += 1;
    if (document.hidden || busy || editing()) { window.setTimeout(poll, INTERVAL_MS); return; }
    busy = true;
    fetch(main.dataset.live, { credentials: "same-origin", headers: { "Accept": "application/json" } })
      .then(function (r) { return r.ok ? r.json() : null; })
      .then(function (state) {
        if (state && state.version !== version) { return refresh(); }
        return null;
      })
      .catch(function () { return null; })
      .then(function () { busy = false; window.setTimeout(poll, INTERVAL_MS); });
  }

  window.setTimeout(poll, INTERVAL_MS);
})();

// The jobs list and the overview refresh their rows by themselves: every few seconds while the tab is
// visible, at most MAX_POLLS times, swapping only their [data-rows] part (the tables, the counts and the
// paging links; never the filter form, so a value being typed stays as it is). The page works without it.
(function () {
  var main = document.getElementById("main");
  if (!main || main.dataset.refresh !== "rows") { return; }
  // Every 5 s, or every data-every seconds (the overview's counts cost more than a page of rows).
  var MAX_POLLS = 900, INTERVAL_MS = (Number(main.dataset.every) || 5) * 1000, polls = 0;
  function swap(text) {
    var fresh = new DOMParser().parseFromString(text, "text/html").getElementById("main");
    var old = main.querySelector("[data-rows]"), rows = fresh && fresh.querySelector("[data-rows]");
    if (!old || !rows) { return; }  // another page (an error page): keep what is shown
    old.replaceWith(document.importNode(rows, true));
    main.dataset.refreshed = String(polls);
  }

  function choosing() {
    // Rows ticked for an action, or a field of the table being used: a refresh would drop the choice.
    return main.querySelector("input[type=checkbox]:checked, input[type=radio]:checked, table :focus") !== null;
  }

  function poll() {
    if (polls >= MAX_POLLS) { return; }
    polls += 1;
    if (document.hidden || choosing()) { window.setTimeout(poll, INTERVAL_MS); return; }
    fetch(window.location.href, { credentials: "same-origin" })
      .then(function (r) { return r.ok ? r.text() : null; })
      .then(function (text) { if (text !== null && !choosing()) { swap(text); } })
      .catch(function () { return null; })
      .then(function () { window.setTimeout(poll, INTERVAL_MS); });
  }

  window.setTimeout(poll, INTERVAL_MS);
})();
