// Package archtest holds, in its tests, the rules of the module's
// architecture that the compiler does not keep.
package archtest
