package benchwork

import (
	"runtime"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestKernelMemorySumsTheKernelsOwn(t *testing.T) {
	meminfo := []byte("MemTotal:       24000000 kB\nSlab:             900000 kB\nSUnreclaim:       300000 kB\n" +
		"VmallocUsed:       50000 kB\nPercpu:             4000 kB\nHugePages_Total:       0\n")
	got, err := kernelMemory(meminfo)
	require.NoError(t, err)
	assert.Equal(t, int64(300000+50000+4000)<<10, got)
	_, err = kernelMemory([]byte("Percpu: lots kB\n"))
	assert.Error(t, err)
	if runtime.GOOS == "linux" {
		n, err := KernelMemory()
		require.NoError(t, err)
		assert.Positive(t, n)
	}
}

var kept []byte

func TestHeapSeesWhatIsKept(t *testing.T) {
	before := Heap()
	kept = make([]byte, 64<<20)
	after := Heap()
	assert.GreaterOrEqual(t, after-before, int64(60<<20))
	kept = nil
	assert.Less(t, Heap(), after-(60<<20))
}
