//go:build linux

package vmtest

import (
	"bufio"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strconv"
)

// Unix file type bits as cpio (newc) stores them in its mode field.
const (
	cpioDir     = 0o040000
	cpioRegular = 0o100000
	cpioSymlink = 0o120000
	cpioTrailer = "TRAILER!!!"
)

// WriteCPIO writes entries as one cpio archive in the "newc" format that the
// kernel's initramfs unpacker reads, in the given order, followed by the
// trailer and zero padding to a multiple of 512 bytes so that further
// archives can be concatenated after it. Directories must come before the
// entries inside them (Listing.Entries orders them so).
func WriteCPIO(w io.Writer, entries []Entry) error {
	cw := &cpioWriter{w: bufio.NewWriterSize(w, 1<<20)}
	for i, e := range entries {
		if err := cw.entry(uint32(i+1), e); err != nil {
			return fmt.Errorf("cpio %s: %w", e.Path, err)
		}
	}
	if err := cw.header(0, 0, 0, cpioTrailer); err != nil {
		return fmt.Errorf("cpio trailer: %w", err)
	}
	if err := cw.pad(512); err != nil {
		return fmt.Errorf("cpio trailer: %w", err)
	}
	return cw.w.Flush()
}

type cpioWriter struct {
	w *bufio.Writer
	n int64
}

func (c *cpioWriter) entry(ino uint32, e Entry) error {
	switch {
	case e.Mode.IsDir():
		return c.header(ino, cpioDir|uint32(e.Mode.Perm()), 0, e.Path)
	case e.Mode&fs.ModeSymlink != 0:
		if err := c.header(ino, cpioSymlink|0o777, uint32(len(e.Link)), e.Path); err != nil {
			return err
		}
		return c.body([]byte(e.Link))
	case e.Mode.IsRegular():
		return c.file(ino, e)
	default:
		return fmt.Errorf("unsupported file mode %v", e.Mode)
	}
}

func (c *cpioWriter) file(ino uint32, e Entry) error {
	mode := cpioRegular | uint32(e.Mode.Perm())
	if e.Source == "" {
		if err := c.header(ino, mode, uint32(len(e.Data)), e.Path); err != nil {
			return err
		}
		return c.body(e.Data)
	}
	f, err := os.Open(e.Source)
	if err != nil {
		return err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	if st.Size() > 1<<32-1 {
		return fmt.Errorf("%s: too large for cpio", e.Source)
	}
	if err := c.header(ino, mode, uint32(st.Size()), e.Path); err != nil {
		return err
	}
	n, err := io.Copy(c.w, f)
	c.n += n
	if err != nil {
		return err
	}
	if n != st.Size() {
		return fmt.Errorf("%s changed while being archived", e.Source)
	}
	return c.pad(4)
}

// header writes a newc header and the NUL-terminated name, padded to 4.
func (c *cpioWriter) header(ino, mode, size uint32, name string) error {
	nlink := uint32(1)
	if mode&0o170000 == cpioDir {
		nlink = 2
	}
	// magic, ino, mode, uid, gid, nlink, mtime, filesize, devmajor,
	// devminor, rdevmajor, rdevminor, namesize, check.
	fields := []uint32{ino, mode, 0, 0, nlink, 0, size, 0, 0, 0, 0, uint32(len(name) + 1), 0}
	buf := make([]byte, 0, 110+len(name)+1)
	buf = append(buf, "070701"...)
	for _, f := range fields {
		s := strconv.FormatUint(uint64(f), 16)
		for i := len(s); i < 8; i++ {
			buf = append(buf, '0')
		}
		buf = append(buf, s...)
	}
	buf = append(buf, name...)
	buf = append(buf, 0)
	if err := c.write(buf); err != nil {
		return err
	}
	return c.pad(4)
}

func (c *cpioWriter) body(b []byte) error {
	if err := c.write(b); err != nil {
		return err
	}
	return c.pad(4)
}

func (c *cpioWriter) write(b []byte) error {
	n, err := c.w.Write(b)
	c.n += int64(n)
	return err
}

func (c *cpioWriter) pad(to int64) error {
	if r := c.n % to; r != 0 {
		return c.write(make([]byte, to-r))
	}
	return nil
}

// ReadCPIO lists a newc archive (or several concatenated ones): every
// entry's path, mode and, for symlinks and small files, content. It exists
// so that tests can check what an initramfs holds without extracting it.
func ReadCPIO(r io.Reader) ([]Entry, error) {
	br := bufio.NewReader(r)
	var out []Entry
	var off int64
	for {
		if err := skipZeros(br, &off); err == io.EOF {
			return out, nil
		} else if err != nil {
			return nil, err
		}
		e, err := readCPIOEntry(br, &off)
		if err != nil {
			return nil, fmt.Errorf("cpio at offset %d: %w", off, err)
		}
		if e.Path != cpioTrailer {
			out = append(out, e)
		}
	}
}

func skipZeros(br *bufio.Reader, off *int64) error {
	for {
		b, err := br.Peek(1)
		if err != nil {
			return err
		}
		if b[0] != 0 {
			return nil
		}
		_, _ = br.Discard(1)
		*off++
	}
}

func readCPIOEntry(br *bufio.Reader, off *int64) (Entry, error) {
	hdr := make([]byte, 110)
	if _, err := io.ReadFull(br, hdr); err != nil {
		return Entry{}, err
	}
	if string(hdr[:6]) != "070701" {
		return Entry{}, fmt.Errorf("bad magic %q", hdr[:6])
	}
	field := func(i int) (uint64, error) {
		return strconv.ParseUint(string(hdr[6+8*i:14+8*i]), 16, 32)
	}
	mode, err1 := field(1)
	size, err2 := field(6)
	namesize, err3 := field(11)
	if err1 != nil || err2 != nil || err3 != nil || namesize == 0 {
		return Entry{}, fmt.Errorf("bad header")
	}
	name := make([]byte, align4(110+int64(namesize))-110)
	if _, err := io.ReadFull(br, name); err != nil {
		return Entry{}, err
	}
	data := make([]byte, align4(int64(size)))
	if _, err := io.ReadFull(br, data); err != nil {
		return Entry{}, err
	}
	*off += 110 + int64(len(name)) + int64(len(data))
	e := Entry{Path: string(name[:namesize-1]), Mode: fs.FileMode(mode & 0o777)}
	switch mode & 0o170000 {
	case cpioDir:
		e.Mode |= fs.ModeDir
	case cpioSymlink:
		e.Mode |= fs.ModeSymlink
		e.Link = string(data[:size])
	default:
		e.Data = data[:size]
	}
	return e, nil
}

func align4(n int64) int64 { return (n + 3) &^ 3 }
