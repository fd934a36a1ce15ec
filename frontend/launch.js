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
