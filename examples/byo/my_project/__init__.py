"""A user package for Tessera's bring-your-own-model example (see ../README section "Bring your own model")."""
