//go:build kubernetes_e2e

package e2e

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// rbacManifests are the server's RBAC as deployments apply it: its
// rights, and the port-forward a server outside the pod network needs.
var rbacManifests = []string{"../../../deploy/kubernetes/rbac.yaml", "../../../deploy/kubernetes/rbac-portforward.yaml"}

// setup makes a namespace of the test's own (deleted when it ends) and
// returns the cluster admin's clientset, the namespace and the path of a
// kubeconfig that acts as the server's ServiceAccount there: with only
// the rights deploy/kubernetes/rbac.yaml and rbac-portforward.yaml
// grant. Every
// server of these tests runs with it, so a right the manifest lacks
// fails them.
func setup(t *testing.T) (kubernetes.Interface, string, string) {
	t.Helper()
	rc, err := clientcmd.BuildConfigFromFlags("", env(t, "SHEEPFOLD_E2E_KUBECONFIG"))
	if err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	ns := fmt.Sprintf("sf-e2e-%d", time.Now().UnixNano()%1_000_000)
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.CoreV1().Namespaces().Delete(context.Background(), ns, metav1.DeleteOptions{}) })
	sa := applyRBAC(t, cs, ns)
	tok, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(ctx, sa, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: new(int64(2 * 3600))},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("a token of the server's ServiceAccount: %v", err)
	}
	return cs, ns, writeKubeconfig(t, rc, tok.Status.Token)
}

// applyRBAC creates the objects of rbacManifests for namespace ns (the
// cluster-wide ones named for ns and deleted when the test ends) and
// returns the ServiceAccount's name.
func applyRBAC(t *testing.T, cs kubernetes.Interface, ns string) string {
	t.Helper()
	ctx := context.Background()
	rbac := cs.RbacV1()
	var sa string
	bound := map[string]bool{}
	for _, path := range rbacManifests {
		for _, obj := range decodeManifest(t, path) {
			var err error
			cluster := func(name string) string { return name + "-" + ns }
			switch o := obj.(type) {
			case *corev1.ServiceAccount:
				o.Namespace, sa = ns, o.Name
				_, err = cs.CoreV1().ServiceAccounts(ns).Create(ctx, o, metav1.CreateOptions{})
			case *rbacv1.Role:
				o.Namespace = ns
				_, err = rbac.Roles(ns).Create(ctx, o, metav1.CreateOptions{})
			case *rbacv1.RoleBinding:
				o.Namespace = ns
				subjectsIn(o.Subjects, ns)
				bound["Role/"+o.RoleRef.Name] = true
				_, err = rbac.RoleBindings(ns).Create(ctx, o, metav1.CreateOptions{})
			case *rbacv1.ClusterRole:
				o.Name = cluster(o.Name)
				_, err = rbac.ClusterRoles().Create(ctx, o, metav1.CreateOptions{})
				t.Cleanup(func() { rbac.ClusterRoles().Delete(context.Background(), o.Name, metav1.DeleteOptions{}) })
			case *rbacv1.ClusterRoleBinding:
				o.Name, o.RoleRef.Name = cluster(o.Name), cluster(o.RoleRef.Name)
				subjectsIn(o.Subjects, ns)
				bound["ClusterRole/"+o.RoleRef.Name] = true
				_, err = rbac.ClusterRoleBindings().Create(ctx, o, metav1.CreateOptions{})
				t.Cleanup(func() { rbac.ClusterRoleBindings().Delete(context.Background(), o.Name, metav1.DeleteOptions{}) })
			default:
				t.Fatalf("%s: unexpected %T", path, obj)
			}
			if err != nil {
				t.Fatalf("%s: %v", path, err)
			}
		}
	}
	if sa == "" || len(bound) != 3 {
		t.Fatalf("%v: ServiceAccount %q, roles bound %v; want one, and three", rbacManifests, sa, bound)
	}
	return sa
}

// decodeManifest returns the objects of a multi-document YAML file.
func decodeManifest(t *testing.T, path string) []runtime.Object {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var objs []runtime.Object
	docs := yaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(raw)))
	for {
		doc, err := docs.Read()
		if errors.Is(err, io.EOF) {
			return objs
		} else if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if len(bytes.TrimSpace(doc)) == 0 {
			continue
		}
		obj, _, err := scheme.Codecs.UniversalDeserializer().Decode(doc, nil, nil)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		objs = append(objs, obj)
	}
}

func subjectsIn(subjects []rbacv1.Subject, ns string) {
	for i := range subjects {
		if subjects[i].Kind == rbacv1.ServiceAccountKind {
			subjects[i].Namespace = ns
		}
	}
}

// writeKubeconfig writes a kubeconfig for the cluster of rc that
// authenticates with token, and returns its path.
func writeKubeconfig(t *testing.T, rc *rest.Config, token string) string {
	t.Helper()
	ca := rc.CAData
	if len(ca) == 0 {
		var err error
		if ca, err = os.ReadFile(rc.CAFile); err != nil {
			t.Fatal(err)
		}
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["e2e"] = &clientcmdapi.Cluster{Server: rc.Host, CertificateAuthorityData: ca}
	cfg.AuthInfos["sheepfold"] = &clientcmdapi.AuthInfo{Token: token}
	cfg.Contexts["e2e"] = &clientcmdapi.Context{Cluster: "e2e", AuthInfo: "sheepfold"}
	cfg.CurrentContext = "e2e"
	path := filepath.Join(t.TempDir(), "server.kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
	return path
}
