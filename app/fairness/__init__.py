"""Fair sharing of a saturated pool across tenants (the Virtual Token Counter)."""
