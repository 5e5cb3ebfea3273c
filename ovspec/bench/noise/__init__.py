"""The noise floor: how much one decode step's time moves between fresh processes on
this machine with no ovspec code in the loop (``probe`` runs, ``page`` renders)."""
