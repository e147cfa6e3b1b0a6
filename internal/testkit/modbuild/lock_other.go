//go:build !unix

package modbuild

import (
	"errors"
	"runtime"
)

// lock fails: the build cache is shared between processes under a file
// lock, which only unix systems have here.
func lock(string) (func(), error) {
	return nil, errors.New("modbuild: no file locks on " + runtime.GOOS)
}
