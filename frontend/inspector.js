// Trajectory inspector: the step slider moves over the steps that have trajectories and loads the
// chosen one (on release, or Enter), keeping the other filters.

const slider = document.getElementById("step-slider");
const input = document.getElementById("id_step");
const form = document.getElementById("inspector-filters");

if (slider && input && form) {
  const steps = slider.dataset.steps.split(",").map(Number);
  const current = Number(input.value);
  slider.value = String(Math.max(0, steps.indexOf(current)));
  const show = () => {
    const step = steps[Number(slider.value)];
    input.value = String(step);
    slider.setAttribute("aria-valuetext", `step ${step}`);
  };
  slider.addEventListener("input", show);
  slider.addEventListener("change", () => { show(); form.requestSubmit(); });
}
