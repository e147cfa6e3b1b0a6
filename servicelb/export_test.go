package servicelb

import "time"

// SetIdleHook makes Run call f each time it waits, with the time it waits
// for (ok false: until a change).
func SetIdleHook(r *Runner, f func(due time.Time, ok bool)) { r.idle = f }
