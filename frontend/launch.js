// Launch form: picking a script selects the reward function written for it (until the person picks a
// reward themselves), and picking a base model shows the training settings recommended for it.
const hints = JSON.parse(document.getElementById("launch-hints").textContent);
const script = document.getElementById("id_script_version");
const reward = document.getElementById("id_reward_version");
const model = document.getElementById("id_base_model");
const note = document.getElementById("recommended-train");

let rewardChosenByHand = false;
reward?.addEventListener("change", () => { rewardChosenByHand = true; });

script?.addEventListener("change", () => {
  if (!reward || rewardChosenByHand) return;
  const companion = hints.companions[script.value];
  if (companion) reward.value = String(companion);
});

function showRecommended() {
  if (!model || !note) return;
  const entry = hints.recommended[model.value];
  // The learning rate a run of this model gets when the box leaves it out (its recommendation, else the default).
  const train = document.getElementById("id_train");
  if (train && entry) train.placeholder = JSON.stringify({ learning_rate: entry.learning_rate });
  const settings = entry && Object.entries(entry.train);
  if (!settings || settings.length === 0) {
    note.textContent = "Settings left out of this box take artweb's defaults (no recommendations are stored for this model).";
    return;
  }
  const text = settings.map(([key, value]) => `${key} ${JSON.stringify(value)}`).join(", ");
  note.textContent = `Recommended for ${entry.name}: ${text}. Settings left out of this box take these values, then artweb's defaults.`;
}
model?.addEventListener("change", showRecommended);
showRecommended();

// "Score the base model's answers": a dry run form (new tab) prefilled with what this form has chosen,
// 4 samples on 8 scenarios, so the person sees whether the reward gives spread before launching.
const scoreLink = document.getElementById("score-base-answers");
const scenarioSet = document.getElementById("id_scenario_set");

function updateScoreLink() {
  if (!scoreLink) return;
  const query = new URLSearchParams({ samples: "4", scenario_count: "8" });
  for (const [name, el] of [["script_version", script], ["reward_version", reward], ["base_model", model],
                            ["scenario_set", scenarioSet]]) {
    if (el && el.value) query.set(name, el.value);
  }
  // The ticked data attachments too: a script that reads /data/<name> needs them in its dry run as well.
  for (const box of attachmentBoxes()) if (box.checked) query.append("attachments", box.value);
  scoreLink.href = `${scoreLink.dataset.baseUrl}?${query}`;
}
function attachmentBoxes() {
  return document.querySelectorAll('input[name="attachments"]');
}
for (const el of [script, reward, model, scenarioSet, ...attachmentBoxes()]) el?.addEventListener("change", updateScoreLink);
updateScoreLink();
