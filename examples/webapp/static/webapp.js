// The job page: follows the job's events with an EventSource (which reconnects by itself, sending the
// last event's id as Last-Event-ID), shows progress and the model's text as it is written, sends the
// answer the job waits for, and shows the result once the job ends. Every value is set as text.
"use strict";
(function () {
  const job = document.body.dataset.job;
  if (!job) return;
  const $ = (id) => document.getElementById(id);
  const base = "/jobs/" + encodeURIComponent(job);
  let draft = "";
  const drafts = new Map();  // call -> its text so far
  window.webapp = { deltas: 0, events: [], lengths: [] };  // what a test reads

  const source = new EventSource(base + "/events");
  source.onopen = () => { $("status").textContent = "following"; };
  source.onerror = () => { if (source.readyState !== EventSource.CLOSED) $("status").textContent = "reconnecting"; };
  source.addEventListener("status", (e) => {
    const event = JSON.parse(e.data);
    window.webapp.events.push("status:" + event.name);
    $("status").textContent = event.name;
  });
  source.addEventListener("published", (e) => {
    const event = JSON.parse(e.data);
    window.webapp.events.push("published:" + event.name);
    if (event.name === "progress") {
      $("percent").value = Number(event.value.percent) || 0;
      $("phase").textContent = String(event.value.phase);
    } else if (event.name === "question") {
      $("question").textContent = String(event.value.text);
      $("ask").hidden = false;
    }
  });
  source.addEventListener("delta", (e) => {
    const event = JSON.parse(e.data);
    window.webapp.deltas += 1;
    // Text is per model call; a call's text starts over on "restart" (a retry, or the next attempt of a
    // job whose worker died mid-reply streaming the same call again).
    const call = event.value.call;
    drafts.set(call, (event.value.restart ? "" : drafts.get(call) || "") + event.value.text);
    draft = Array.from(drafts.values()).join("\n\n");
    $("draft").textContent = draft;
    window.webapp.lengths.push(draft.length);
  });
  source.addEventListener("end", (e) => {
    const event = JSON.parse(e.data);
    window.webapp.events.push("end:" + event.name);
    source.close();  // the job is over: no reconnect
    $("status").textContent = event.name;
    fetch(base + "/result").then((r) => r.json()).then((body) => {
      $("result").textContent = JSON.stringify(body.result !== undefined ? body.result : body, null, 2);
    });
  });

  $("ask").addEventListener("submit", (e) => {
    e.preventDefault();
    const text = $("answer").value;
    fetch(base + "/answer", {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ text: text }),
    }).then((r) => r.json()).then((body) => {
      if (body.sent) $("ask").hidden = true;
      else $("question").textContent = String(body.error);
    });
  });
})();
