-- budget_used: KEYS[1] = the budget counter; returns {used, reserved} after purging.
local used, held = budget(KEYS[1])
return {num(used), num(held)}
