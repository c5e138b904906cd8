// kvcargo ui: the page's state in the URL's fragment, so that a configuration can be shared and
// reloaded. `#c.prompt=4096&c.send=layerwise&preset=eth-25g-14&s.rate=10&pin=1&p.link=eth-25g`:
// `c.` calculator inputs and `s.` simulator inputs that differ from their defaults, the chosen
// preset (then its inputs are implied), and `pin` with the pinned run's own `p.` inputs.
"use strict";

function readSharedState(hash = location.hash) {
  const params = new URLSearchParams(hash.replace(/^#/, ""));
  const out = { calc: {}, sim: {}, preset: params.get("preset") || "", pin: params.has("pin") ? {} : null };
  for (const [key, value] of params) {
    const name = key.slice(2);
    if (key.startsWith("c.")) out.calc[name] = value;
    else if (key.startsWith("s.")) out.sim[name] = value;
    else if (key.startsWith("p.") && out.pin) out.pin[name] = value;
  }
  return out;
}

function writeSharedState({ calc, sim, preset, pin }) {
  const params = new URLSearchParams();
  for (const [name, value] of Object.entries(calc)) params.set(`c.${name}`, value);
  if (preset) params.set("preset", preset);
  else for (const [name, value] of Object.entries(sim)) params.set(`s.${name}`, value);
  if (pin) {
    params.set("pin", "1");
    for (const [name, value] of Object.entries(pin)) params.set(`p.${name}`, value);
  }
  const hash = params.toString();
  if (hash !== location.hash.replace(/^#/, "")) {
    history.replaceState(null, "", hash ? `#${hash}` : location.pathname + location.search);
  }
}
