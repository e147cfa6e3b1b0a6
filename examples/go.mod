module github.com/kproxy-dev/kproxy/examples

go 1.26

require github.com/kproxy-dev/kproxy v0.0.0

replace github.com/kproxy-dev/kproxy => ../
