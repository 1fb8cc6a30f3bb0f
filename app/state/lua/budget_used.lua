-- budget_used: KEYS = the budget counter, its `:held` and `:amt`; returns {used, reserved}
-- after purging expired reservations.
local used, held = budget({k = KEYS[1], held = KEYS[2], amt = KEYS[3]})
return {num(used), num(held)}
