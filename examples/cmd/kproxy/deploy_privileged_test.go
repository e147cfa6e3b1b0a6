//go:build privileged

package main

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/yaml"

	kubelayer "github.com/kproxy-dev/kproxy/kube"
	"github.com/kproxy-dev/kproxy/kube/kubeproxyconfig"
)

const deployDir = "../../../deploy/kubernetes"

// manifests reads the objects kustomization.yaml lists, and checks that
// it lists every manifest of the directory.
func manifests(t *testing.T) []*unstructured.Unstructured {
	t.Helper()
	var k struct{ Resources []string }
	data, err := os.ReadFile(filepath.Join(deployDir, "kustomization.yaml"))
	require.NoError(t, err)
	require.NoError(t, yaml.Unmarshal(data, &k))
	files, err := filepath.Glob(filepath.Join(deployDir, "*.yaml"))
	require.NoError(t, err)
	var names []string
	for _, f := range files {
		if b := filepath.Base(f); b != "kustomization.yaml" {
			names = append(names, b)
		}
	}
	assert.ElementsMatch(t, names, k.Resources, "kustomization.yaml lists every manifest")
	var out []*unstructured.Unstructured
	for _, f := range k.Resources {
		data, err := os.ReadFile(filepath.Join(deployDir, f))
		require.NoError(t, err)
		var m map[string]any
		require.NoError(t, yaml.Unmarshal(data, &m), f)
		out = append(out, &unstructured.Unstructured{Object: m})
	}
	return out
}

func find(t *testing.T, objs []*unstructured.Unstructured, kind string) *unstructured.Unstructured {
	t.Helper()
	for _, o := range objs {
		if o.GetKind() == kind {
			return o
		}
	}
	t.Fatalf("no %s in %s", kind, deployDir)
	return nil
}

// apply applies objects by server-side apply, with dry-run=All or for
// real.
func apply(t *testing.T, cfg *rest.Config, objs []*unstructured.Unstructured, dryRun bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dc, err := kubernetes.NewForConfig(cfg)
	require.NoError(t, err)
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc.Discovery()))
	dyn, err := dynamic.NewForConfig(cfg)
	require.NoError(t, err)
	opts := metav1.ApplyOptions{FieldManager: "kproxy-test", Force: true}
	if dryRun {
		opts.DryRun = []string{metav1.DryRunAll}
	}
	for _, o := range objs {
		gvk := o.GroupVersionKind()
		m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		require.NoError(t, err, gvk)
		var r dynamic.ResourceInterface = dyn.Resource(m.Resource)
		if ns := o.GetNamespace(); ns != "" {
			r = dyn.Resource(m.Resource).Namespace(ns)
		}
		_, err = r.Apply(ctx, o.GetName(), o, opts)
		require.NoError(t, err, "%s %s", o.GetKind(), o.GetName())
	}
}

// The manifests are valid objects for the API server, and the ConfigMap's
// configuration is one kproxy uses whole.
func TestDeployManifestsValidate(t *testing.T) {
	cfg, err := kubelayer.RestConfig(kubelayer.ClientOptions{Kubeconfig: apiServer(t).Kubeconfig})
	require.NoError(t, err)
	objs := manifests(t)
	apply(t, cfg, objs, true)

	ds := find(t, objs, "DaemonSet")
	spec, _, _ := unstructured.NestedMap(ds.Object, "spec", "template", "spec")
	assert.Equal(t, "system-node-critical", spec["priorityClassName"])
	assert.Equal(t, true, spec["hostNetwork"])
	containers, _, _ := unstructured.NestedSlice(spec, "containers")
	require.Len(t, containers, 1)
	caps, _, _ := unstructured.NestedMap(containers[0].(map[string]any), "securityContext", "capabilities")
	assert.Equal(t, []any{"NET_ADMIN"}, caps["add"], "NET_ADMIN and nothing else")
	assert.Equal(t, []any{"ALL"}, caps["drop"])

	cm := find(t, objs, "ConfigMap")
	data, _, _ := unstructured.NestedStringMap(cm.Object, "data")
	c, warnings, err := kubeproxyconfig.Parse([]byte(data["config.yaml"]))
	require.NoError(t, err)
	assert.Empty(t, warnings)
	r, err := kubeproxyconfig.Resolve(c, kubeproxyconfig.Context{Source: "kubernetes"})
	require.NoError(t, err, "kube-proxy would take the shipped configuration")
	assert.Empty(t, r.Ignored, "the shipped configuration sets nothing kproxy ignores")
	assert.Empty(t, r.Warnings)
	settings := map[string]string{}
	for _, s := range r.Settings {
		settings[s.Flag] = s.Value
	}
	// An unprivileged container writes no sysctl.
	assert.Equal(t, "0", settings["conntrack-max-per-core"])
	assert.Equal(t, "0s", settings["conntrack-tcp-timeout-established"])
	assert.Equal(t, "0s", settings["conntrack-tcp-timeout-close-wait"])
	_, err = clientcmd.Load([]byte(data["kubeconfig.conf"]))
	require.NoError(t, err)
}

// rule is one verb on one resource.
type rule struct{ group, resource, verb string }

// granted returns what the identity of cfg may do in namespace ns, as
// the API server says (SelfSubjectRulesReview), without what every
// authenticated user may do (discovery, reviews of itself).
func granted(t *testing.T, c kubernetes.Interface, ns string) []rule {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rev, err := c.AuthorizationV1().SelfSubjectRulesReviews().Create(ctx,
		&authorizationv1.SelfSubjectRulesReview{Spec: authorizationv1.SelfSubjectRulesReviewSpec{Namespace: ns}}, metav1.CreateOptions{})
	require.NoError(t, err)
	var out []rule
	for _, r := range rev.Status.ResourceRules {
		for _, g := range r.APIGroups {
			if g == "authorization.k8s.io" || g == "authentication.k8s.io" {
				continue
			}
			for _, res := range r.Resources {
				for _, v := range r.Verbs {
					out = append(out, rule{g, res, v})
				}
			}
		}
	}
	slices.SortFunc(out, func(a, b rule) int { return strings.Compare(a.group+a.resource+a.verb, b.group+b.resource+b.verb) })
	return out
}

// allowed asks the API server whether the identity of c may do r.
func allowed(t *testing.T, c kubernetes.Interface, r rule) bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rev, err := c.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, &authorizationv1.SelfSubjectAccessReview{
		Spec: authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &authorizationv1.ResourceAttributes{
			Group: r.group, Resource: r.resource, Verb: r.verb}}}, metav1.CreateOptions{})
	require.NoError(t, err)
	return rev.Status.Allowed
}

// The ServiceAccount, ClusterRole and binding let kproxy do what it does
// and nothing more: run with a token of the ServiceAccount (TokenRequest)
// and the ConfigMap's configuration, it syncs; it is granted exactly the
// verbs it uses; without any one rule of the ClusterRole it cannot sync.
func TestDeployRBAC(t *testing.T) {
	kube := apiServer(t)
	admin := adminClient(t)
	cfg, err := kubelayer.RestConfig(kubelayer.ClientOptions{Kubeconfig: kube.Kubeconfig})
	require.NoError(t, err)
	objs := manifests(t)
	var rbac []*unstructured.Unstructured
	for _, o := range objs {
		if k := o.GetKind(); k == "ServiceAccount" || k == "ClusterRole" || k == "ClusterRoleBinding" {
			rbac = append(rbac, o)
		}
	}
	apply(t, cfg, rbac, false)

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	sa := find(t, objs, "ServiceAccount")
	tok, err := admin.CoreV1().ServiceAccounts(sa.GetNamespace()).CreateToken(ctx, sa.GetName(),
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr(int64(3600))}}, metav1.CreateOptions{})
	require.NoError(t, err)
	kubeconfig := saKubeconfig(t, find(t, objs, "ConfigMap"), kube.URL, tok.Status.Token)
	saCfg, err := kubelayer.RestConfig(kubelayer.ClientOptions{Kubeconfig: kubeconfig})
	require.NoError(t, err)
	saClient, err := kubernetes.NewForConfig(saCfg)
	require.NoError(t, err)

	want := []rule{{"", "nodes", "list"}, {"", "nodes", "watch"}, {"", "services", "list"}, {"", "services", "watch"},
		{"discovery.k8s.io", "endpointslices", "list"}, {"discovery.k8s.io", "endpointslices", "watch"},
		{"networking.k8s.io", "servicecidrs", "list"}, {"networking.k8s.io", "servicecidrs", "watch"}}
	assert.ElementsMatch(t, want, granted(t, saClient, "default"), "granted exactly what kproxy uses")
	assert.ElementsMatch(t, want, granted(t, saClient, "kube-system"))

	createWeb(t, admin, "deploy", "10.96.8.8")
	_, err = admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "deploy-node"},
		Spec: corev1.NodeSpec{PodCIDRs: []string{"10.244.1.0/24"}}}, metav1.CreateOptions{})
	require.NoError(t, err)
	config := filepath.Join(t.TempDir(), "config.yaml")
	data, _, _ := unstructured.NestedStringMap(find(t, objs, "ConfigMap").Object, "data")
	require.NoError(t, os.WriteFile(config, []byte(data["config.yaml"]), 0o644))
	runWithRole := func(d time.Duration) (int, string, string) {
		// The DaemonSet's command line, with the node reading its pod
		// CIDRs (nodes list) and the kubeconfig of this API server.
		return runFor(t, d, "--config", config, "--kubeconfig", kubeconfig, "--node-name", "deploy-node",
			"--detect-local-mode", "NodeCIDR", "--dry-run", "--once")
	}
	code, out, logs := runWithRole(time.Minute)
	require.Equal(t, 0, code, logs)
	has(t, out, "10.96.8.8 . tcp . 80", "synced with the ServiceAccount's token")
	has(t, out, "10.244.1.0/24", "the Node's pod CIDRs")
	assert.NotContains(t, logs, "config field ignored")

	role := find(t, objs, "ClusterRole")
	rules, _, _ := unstructured.NestedSlice(role.Object, "rules")
	require.Len(t, rules, 4)
	for i := range rules {
		r := rules[i].(map[string]any)
		name := strings.Join(toStrings(r["resources"]), ",")
		t.Run("without "+name, func(t *testing.T) {
			cut := role.DeepCopy()
			require.NoError(t, unstructured.SetNestedSlice(cut.Object, slices.Delete(slices.Clone(rules), i, i+1), "rules"))
			apply(t, cfg, []*unstructured.Unstructured{cut}, false)
			defer apply(t, cfg, []*unstructured.Unstructured{role}, false)
			gone := rule{toStrings(r["apiGroups"])[0], name, toStrings(r["verbs"])[0]}
			require.Eventually(t, func() bool { return !allowed(t, saClient, gone) }, 30*time.Second, 100*time.Millisecond)
			if name == "servicecidrs" {
				// Without them, the configured service CIDRs alone hold,
				// after a wait, with a warning.
				code, out, logs := runWithRole(time.Minute)
				assert.Equal(t, 0, code, logs)
				has(t, out, "10.96.8.8 . tcp . 80", "synced without servicecidrs")
				assert.Contains(t, logs, "forbidden")
				return
			}
			_, out, logs := runWithRole(5 * time.Second)
			assert.NotContains(t, out, "10.96.8.8 . tcp . 80", "synced without %s", name)
			assert.Contains(t, logs, "forbidden")
			if name == "nodes" {
				assert.Contains(t, logs, "waiting for the node's pod CIDRs", "a node whose pod CIDRs cannot be read yet is waited for")
			}
		})
	}
}

func toStrings(v any) []string {
	var out []string
	for _, x := range v.([]any) {
		out = append(out, x.(string))
	}
	return out
}

// saKubeconfig writes the ConfigMap's kubeconfig.conf pointed at server,
// with the token in a file where the pod's would be, and returns its
// path.
func saKubeconfig(t *testing.T, cm *unstructured.Unstructured, server, token string) string {
	t.Helper()
	data, _, _ := unstructured.NestedStringMap(cm.Object, "data")
	kc, err := clientcmd.Load([]byte(data["kubeconfig.conf"]))
	require.NoError(t, err)
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "token")
	require.NoError(t, os.WriteFile(tokenFile, []byte(token), 0o600))
	for _, c := range kc.Clusters {
		require.Equal(t, "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt", c.CertificateAuthority)
		// The test server's certificate is self-signed.
		c.Server, c.CertificateAuthority, c.InsecureSkipTLSVerify = server, "", true
	}
	for _, u := range kc.AuthInfos {
		require.Equal(t, "/var/run/secrets/kubernetes.io/serviceaccount/token", u.TokenFile)
		u.TokenFile = tokenFile
	}
	path := filepath.Join(dir, "kubeconfig")
	require.NoError(t, clientcmd.WriteToFile(*kc, path))
	return path
}

// TestBackendCapsAreDeployed: the capabilities TestCapabilities runs each
// backend with are those the deployment grants it: the DaemonSet's, with
// the patches of the backend's overlay in deploy/backends applied.
func TestBackendCapsAreDeployed(t *testing.T) {
	base := find(t, manifests(t), "DaemonSet")
	doc, err := base.MarshalJSON()
	require.NoError(t, err)
	for backend, want := range backendCaps {
		t.Run(backend, func(t *testing.T) {
			ds := doc
			data, err := os.ReadFile(filepath.Join(deployDir, "..", "backends", backend, "kustomization.yaml"))
			if err == nil {
				var k struct {
					Patches []struct {
						Target struct{ Kind, Name string }
						Patch  string
					}
				}
				require.NoError(t, yaml.Unmarshal(data, &k))
				for _, p := range k.Patches {
					require.Equal(t, "DaemonSet", p.Target.Kind, "a patch of the overlay")
					ops, err := yaml.YAMLToJSON([]byte(p.Patch))
					require.NoError(t, err)
					patch, err := jsonpatch.DecodePatch(ops)
					require.NoError(t, err)
					ds, err = patch.Apply(ds)
					require.NoError(t, err)
				}
			} else {
				require.ErrorIs(t, err, os.ErrNotExist)
			}
			var got struct {
				Spec struct {
					Template struct {
						Spec struct {
							Containers []struct {
								SecurityContext struct {
									Capabilities struct{ Add, Drop []string }
								} `json:"securityContext"`
							}
						}
					}
				}
			}
			require.NoError(t, yaml.Unmarshal(ds, &got))
			require.NotEmpty(t, got.Spec.Template.Spec.Containers)
			caps := got.Spec.Template.Spec.Containers[0].SecurityContext.Capabilities
			assert.Equal(t, []string{"ALL"}, caps.Drop)
			var granted []string
			for _, c := range caps.Add {
				granted = append(granted, strings.ToLower(c))
			}
			assert.ElementsMatch(t, want, granted)
		})
	}
}
