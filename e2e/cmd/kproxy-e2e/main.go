// Command kproxy-e2e runs Kubernetes' own end-to-end tests of services
// against kproxy and against kube-proxy, in a real cluster built from
// source on this machine (package cluster), and writes the report that
// puts their results side by side (make test-e2e):
//
//	kproxy-e2e run [-suite full|smoke] [-focus REGEXP] [-proxies kproxy-nftables,...] [-results DIR]
//	kproxy-e2e up [-proxies kproxy-nftables] start a cluster with the first proxy and keep it, for a look inside
//	kproxy-e2e reap                           remove what a crashed run left
//	kproxy-e2e report [-results DIR]          write the report again from the JUnit files
//
// It needs root, and the Debian packages that e2e/hack/deps.sh installs.
// Every proxy runs in a cluster of its own, started afresh: the same
// components, nodes and images, so that nothing one proxy left behind
// reaches the next.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"time"

	"github.com/kproxy-dev/kproxy/e2e/build"
	"github.com/kproxy-dev/kproxy/e2e/cluster"
	"github.com/kproxy-dev/kproxy/e2e/images"
	"github.com/kproxy-dev/kproxy/e2e/proxy"
	"github.com/kproxy-dev/kproxy/e2e/suite"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == cluster.HolderCommand {
		if len(os.Args) != 4 {
			fmt.Fprintln(os.Stderr, "usage: kproxy-e2e", cluster.HolderCommand, "HOSTNAME DIR")
			os.Exit(2)
		}
		if err := cluster.Hold(os.Args[2], os.Args[3]); err != nil {
			fmt.Fprintln(os.Stderr, "holder:", err)
			os.Exit(1)
		}
		return
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "kproxy-e2e:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string) error {
	if len(args) == 0 {
		return errors.New("want a command: run, up, reap or report")
	}
	switch args[0] {
	case "run":
		return runCmd(ctx, args[1:])
	case "up":
		return upCmd(ctx, args[1:])
	case "reap":
		fs := flag.NewFlagSet("reap", flag.ExitOnError)
		dir := fs.String("dir", cluster.DefaultDir, "the cluster's directory")
		fs.Parse(args[1:])
		return errors.Join(cluster.Reap(ctx, *dir), os.RemoveAll(imagesDir(*dir)))
	case "report":
		fs := flag.NewFlagSet("report", flag.ExitOnError)
		results := fs.String("results", "results", "the results directory")
		fs.Parse(args[1:])
		_, err := suite.WriteReport(*results)
		return err
	}
	return fmt.Errorf("unknown command %q: want run, up, reap or report", args[0])
}

// options are the flags of run and up.
type options struct {
	repo, dir, results, kproxyImage string
	nodes                           int
	suite                           suite.Suite
	proxies                         []proxy.Proxy
}

func (o *options) register(fs *flag.FlagSet) (suiteName, proxies, focus *string, procs *int) {
	fs.StringVar(&o.repo, "repo", "..", "the project's checkout")
	fs.StringVar(&o.dir, "dir", cluster.DefaultDir, "the cluster's directory while it runs")
	fs.StringVar(&o.kproxyImage, "kproxy-image", "", "kproxy's OCI image layout (default: REPO/bin/kproxy-image, from make image)")
	fs.IntVar(&o.nodes, "nodes", 3, "worker nodes")
	suiteName = fs.String("suite", "full", "the tests: full or smoke")
	var names []string
	for _, p := range proxy.All {
		names = append(names, p.Name)
	}
	proxies = fs.String("proxies", strings.Join(names, ","), "the proxies, each in a cluster of its own, in this order")
	procs = fs.Int("procs", 0, "ginkgo's parallel processes (default: the suite's)")
	focus = fs.String("focus", "", "the tests to run, a regular expression over their full texts, in place of the suite's (its skips stay), such as one failing test's name")
	return suiteName, proxies, focus, procs
}

func (o *options) parse(suiteName, proxies, focus string, procs int) error {
	var err error
	if o.suite, err = suite.Lookup(suiteName); err != nil {
		return err
	}
	if focus != "" {
		if _, err := regexp.Compile(focus); err != nil {
			return fmt.Errorf("-focus: %w", err)
		}
		o.suite.Focus = focus
	}
	if procs > 0 {
		o.suite.Procs = procs
	}
	for _, n := range strings.Split(proxies, ",") {
		p, err := proxy.Lookup(strings.TrimSpace(n))
		if err != nil {
			return err
		}
		o.proxies = append(o.proxies, p)
	}
	if o.repo, err = filepath.Abs(o.repo); err != nil {
		return err
	}
	if o.kproxyImage == "" {
		o.kproxyImage = filepath.Join(o.repo, "bin", "kproxy-image")
	}
	return nil
}

func runCmd(ctx context.Context, args []string) error {
	var o options
	fs := flag.NewFlagSet("run", flag.ExitOnError)
	suiteName, proxies, focus, procs := o.register(fs)
	fs.StringVar(&o.results, "results", "results", "where each proxy's JUnit report and the report go")
	fs.Parse(args)
	if err := o.parse(*suiteName, *proxies, *focus, *procs); err != nil {
		return err
	}
	results, err := filepath.Abs(o.results)
	if err != nil {
		return err
	}
	t := newTimes()
	defer os.RemoveAll(imagesDir(o.dir))
	art, err := prepare(ctx, o, t)
	if err != nil {
		return err
	}
	for _, p := range o.proxies {
		if err := runProxy(ctx, o, art, p, filepath.Join(results, p.Name), t); err != nil {
			return fmt.Errorf("%s: %w", p.Name, err)
		}
	}
	rep, err := suite.WriteReport(results)
	if err != nil {
		return err
	}
	fmt.Print(t)
	fmt.Printf("report: %s\n", filepath.Join(results, suite.ReportFile))
	return rep.Verdict()
}

// artifacts are what every cluster of a run is made of.
type artifacts struct {
	kube, coredns string // binary directories
	archives      []string
	kproxyImage   string
}

// prepare builds (or finds in the cache) the binaries and writes the
// images.
func prepare(ctx context.Context, o options, t *times) (*artifacts, error) {
	e2eDir := filepath.Join(o.repo, "e2e")
	art := &artifacts{}
	step := t.start("build Kubernetes " + build.KubernetesVersion)
	dir, built, err := build.Kubernetes(e2eDir, os.Stderr).Output(ctx)
	if err != nil {
		return nil, err
	}
	step.done(built)
	art.kube = dir
	step = t.start("build CoreDNS " + build.CoreDNSVersion)
	dir, built, err = build.CoreDNS(e2eDir, os.Stderr).Output(ctx)
	if err != nil {
		return nil, err
	}
	step.done(built)
	art.coredns = filepath.Join(dir, "coredns")
	step = t.start("images")
	imgDir := imagesDir(o.dir)
	if err := os.MkdirAll(imgDir, 0o755); err != nil {
		return nil, err
	}
	pause := filepath.Join(imgDir, "pause")
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-ldflags=-s -w", "-o", pause, "./images/pause")
	cmd.Dir, cmd.Env = e2eDir, append(os.Environ(), "GOWORK=off", "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("build pause: %w: %s", err, out)
	}
	src, err := build.KubernetesSource(ctx, e2eDir)
	if err != nil {
		return nil, err
	}
	srcs := images.Sources{
		Agnhost: filepath.Join(art.kube, "agnhost"), Porter: filepath.Join(src, "test", "images", "agnhost", "porter"),
		Pause: pause, KubeProxy: filepath.Join(art.kube, "kube-proxy"),
		RegressionIssue74839: filepath.Join(art.kube, "regression-issue-74839"), CoreDNS: art.coredns,
	}
	test, err := images.Test(srcs)
	if err != nil {
		return nil, err
	}
	if err := images.WriteArchive(filepath.Join(imgDir, "test.tar"), test...); err != nil {
		return nil, err
	}
	art.archives = append(art.archives, filepath.Join(imgDir, "test.tar"))
	kp, err := images.KubeProxyImage(srcs)
	if err != nil {
		return nil, err
	}
	if err := images.WriteArchive(filepath.Join(imgDir, "kube-proxy.tar"), kp); err != nil {
		return nil, err
	}
	art.archives = append(art.archives, filepath.Join(imgDir, "kube-proxy.tar"))
	art.kproxyImage = "docker.io/library/kproxy:e2e"
	if err := images.ArchiveLayout(o.kproxyImage, art.kproxyImage, filepath.Join(imgDir, "kproxy.tar")); err != nil {
		return nil, fmt.Errorf("kproxy's image (make image): %w", err)
	}
	art.archives = append(art.archives, filepath.Join(imgDir, "kproxy.tar"))
	step.done(true)
	return art, nil
}

// imagesDir holds a run's image archives, beside the cluster's directory
// (which each cluster's start empties); the run removes it at its end.
func imagesDir(dir string) string { return strings.TrimSuffix(dir, "/") + ".images" }

// up starts a cluster of the artifacts.
func up(ctx context.Context, o options, art *artifacts) (*cluster.Cluster, error) {
	return cluster.Up(ctx, cluster.Config{
		Dir: o.dir, Nodes: o.nodes, Bin: art.kube, CoreDNS: art.coredns, Images: art.archives, Log: os.Stderr,
	})
}

// runProxy runs the suite against the proxy in a cluster of its own, and
// keeps its JUnit report and the proxy's logs in dir.
func runProxy(ctx context.Context, o options, art *artifacts, p proxy.Proxy, dir string, t *times) (err error) {
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	step := t.start(p.Name + ": cluster up")
	c, err := up(ctx, o, art)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, c.Down()) }()
	step.done(true)
	step = t.start(p.Name + ": deploy")
	env := proxy.Env{Repo: o.repo, KubeadmBin: filepath.Join(art.kube, "kubeadm"), KProxyImage: art.kproxyImage, Dir: filepath.Join(o.dir, "deploy")}
	if err := p.Deploy(ctx, c, env); err != nil {
		return err
	}
	step.done(true)
	step = t.start(p.Name + ": " + o.suite.Name + " tests")
	r := suite.Runner{Ginkgo: filepath.Join(art.kube, "ginkgo"), E2ETest: filepath.Join(art.kube, "e2e.test"), Out: os.Stdout}
	runErr := r.Run(ctx, o.suite, c, dir, false)
	step.done(true)
	meta := suite.Meta{Proxy: p.Name, Suite: o.suite.Name, Date: time.Now().UTC(), Seconds: step.took().Seconds(), Nodes: o.nodes, Procs: o.suite.Procs}
	return errors.Join(runErr, suite.KeepLogs(c, dir), suite.WriteMeta(dir, meta))
}

func upCmd(ctx context.Context, args []string) error {
	var o options
	fs := flag.NewFlagSet("up", flag.ExitOnError)
	suiteName, proxies, focus, procs := o.register(fs)
	fs.Parse(args)
	if err := o.parse(*suiteName, *proxies, *focus, *procs); err != nil {
		return err
	}
	t := newTimes()
	defer os.RemoveAll(imagesDir(o.dir))
	art, err := prepare(ctx, o, t)
	if err != nil {
		return err
	}
	c, err := up(ctx, o, art)
	if err != nil {
		return err
	}
	defer c.Down()
	p := o.proxies[0]
	env := proxy.Env{Repo: o.repo, KubeadmBin: filepath.Join(art.kube, "kubeadm"), KProxyImage: art.kproxyImage, Dir: filepath.Join(o.dir, "deploy")}
	if err := p.Deploy(ctx, c, env); err != nil {
		return err
	}
	fmt.Print(t)
	fmt.Printf("cluster up with %s; kubectl from its namespace:\n  nsenter --net=/run/netns/%scp -- %s --kubeconfig %s get pods -A\nInterrupt to bring it down.\n",
		p.Name, cluster.NetNSPrefix, c.KubectlPath(), c.Kubeconfig)
	<-ctx.Done()
	return nil
}
