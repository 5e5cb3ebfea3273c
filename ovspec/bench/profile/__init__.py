"""`ovspec profile`'s library half: where a rung's decode step goes next to the dynamic
stateful model, and the measured floors (the stateful step, a weights-only read) the
protocol bench holds each band to."""
