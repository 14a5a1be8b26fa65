// Progressive enhancement of the task page: follow its log live through the API's own
// resumable stream (GET /v1/tasks/{id}/logs?offset=N&follow=true, authenticated by the
// session cookie), resuming from the byte offset reached after a broken connection.
// Without JavaScript the page shows the log as it was when loaded.
"use strict";
(function () {
  const log = document.getElementById("log");
  if (!log || log.dataset.active !== "true" || !window.fetch || !window.TextDecoder) return;
  const status = document.getElementById("log-status");
  const task = log.dataset.task;
  let offset = Number(log.dataset.offset) || 0;
  const say = (text) => { if (status) status.textContent = text; };
  const pinned = () => window.innerHeight + window.scrollY >= document.body.scrollHeight - 40;

  async function follow() {
    let failures = 0;
    for (;;) {
      try {
        const response = await fetch(`/v1/tasks/${task}/logs?offset=${offset}&follow=true`, {
          credentials: "same-origin",
          headers: { Accept: "text/plain" },
        });
        if (!response.ok) {
          say(`The live log stopped (${response.status}); reload the page to try again.`);
          return;
        }
        say("Following the log live.");
        log.dataset.following = "true";
        const reader = response.body.getReader();
        const decoder = new TextDecoder();
        for (;;) {
          const { done, value } = await reader.read();
          if (done) break;
          failures = 0;
          offset += value.length;
          const follow = pinned();
          log.append(document.createTextNode(decoder.decode(value, { stream: true })));
          log.dataset.offset = String(offset);
          if (follow) window.scrollTo(0, document.body.scrollHeight);
        }
        // The stream ends once the task has ended and all its output was sent: show the
        // final state, outputs and resources.
        say("The task has ended.");
        window.location.reload();
        return;
      } catch (error) {
        failures += 1;
        say(`Connection lost; resuming from byte ${offset}…`);
        await new Promise((resolve) => setTimeout(resolve, Math.min(1000 * failures, 10000)));
      }
    }
  }
  follow();
})();
