// helm-template: render a chart directory with values the way `helm template` (and so a Helm
// install) renders it, through the Helm SDK at the version versions.py pins (HELM_VERSION).
//
// It follows helm.sh/helm/v3 pkg/action/install.go (Install.RunWithContext with ClientOnly, the
// `helm template` path) and pkg/action/action.go (renderResources), without the parts that need a
// cluster or a release store:
//
//   - chartutil.ProcessDependenciesWithMerge: subchart conditions, tags, aliases, import-values;
//   - a dependency that stays enabled must be in the chart's charts/ (action.CheckDependencies);
//   - the default capabilities with the given Kubernetes version and extra API versions;
//   - chartutil.ToRenderValuesWithSchemaValidation: values.schema.json, where a chart has one;
//   - the chart's kubeVersion constraint;
//   - engine.Engine.Render, NOTES.txt taken out, releaseutil.SortManifests in InstallOrder.
//
// Input (stdin, JSON): {"chart": dir, "name": release, "namespace": ns, "kubeVersion": "v1.34.4",
// "apiVersions": ["group/version", "group/version/Kind", ...], "values": {...}}.
// Output (stdout, JSON): {"manifests": [{"source", "content"}] in install order, "hooks": [{"source",
// "kind", "name", "events", "weight", "content"}], "crds": [{"source", "content"}], "notes",
// "warnings": what Helm logged while rendering}.
// A failure is one line on stderr and exit status 1.
package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log"
	"os"
	"strings"

	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"helm.sh/helm/v3/pkg/releaseutil"
)

type request struct {
	Chart       string                 `json:"chart"`
	Name        string                 `json:"name"`
	Namespace   string                 `json:"namespace"`
	KubeVersion string                 `json:"kubeVersion"`
	APIVersions []string               `json:"apiVersions"`
	Values      map[string]interface{} `json:"values"`
}

type manifest struct {
	Source  string `json:"source"`
	Content string `json:"content"`
}

type hook struct {
	Source  string   `json:"source"`
	Kind    string   `json:"kind"`
	Name    string   `json:"name"`
	Events  []string `json:"events"`
	Weight  int      `json:"weight"`
	Content string   `json:"content"`
}

type result struct {
	Manifests []manifest `json:"manifests"`
	Hooks     []hook     `json:"hooks"`
	CRDs      []manifest `json:"crds"`
	Notes     string     `json:"notes"`
	Warnings  []string   `json:"warnings"`
}

func render(req request) (*result, error) {
	chrt, err := loader.Load(req.Chart)
	if err != nil {
		return nil, err
	}
	vals := req.Values
	if vals == nil {
		vals = map[string]interface{}{}
	}
	if err := chartutil.ProcessDependenciesWithMerge(chrt, vals); err != nil {
		return nil, err
	}
	present := map[string]bool{}
	for _, dep := range chrt.Dependencies() {
		present[dep.Name()] = true
	}
	for _, dep := range chrt.Metadata.Dependencies {
		if dep.Enabled && !present[dep.Name] && (dep.Alias == "" || !present[dep.Alias]) {
			return nil, fmt.Errorf("the chart's dependency %s %s is enabled but not in its charts/ directory", dep.Name, dep.Version)
		}
	}
	caps := chartutil.DefaultCapabilities.Copy()
	if req.KubeVersion != "" {
		kv, err := chartutil.ParseKubeVersion(req.KubeVersion)
		if err != nil {
			return nil, err
		}
		caps.KubeVersion = *kv
	}
	caps.APIVersions = append(caps.APIVersions, req.APIVersions...)
	options := chartutil.ReleaseOptions{Name: req.Name, Namespace: req.Namespace, Revision: 1, IsInstall: true}
	values, err := chartutil.ToRenderValuesWithSchemaValidation(chrt, vals, options, caps, false)
	if err != nil {
		return nil, err
	}
	if chrt.Metadata.KubeVersion != "" && !chartutil.IsCompatibleRange(chrt.Metadata.KubeVersion, caps.KubeVersion.String()) {
		return nil, fmt.Errorf("chart requires kubeVersion: %s which is incompatible with Kubernetes %s", chrt.Metadata.KubeVersion, caps.KubeVersion.String())
	}
	var e engine.Engine
	files, err := e.Render(chrt, values)
	if err != nil {
		return nil, err
	}
	out := &result{Manifests: []manifest{}, Hooks: []hook{}, CRDs: []manifest{}}
	for name, text := range files {
		if strings.HasSuffix(name, "NOTES.txt") {
			if name == chrt.Name()+"/templates/NOTES.txt" {
				out.Notes = text
			}
			delete(files, name)
		}
	}
	hooks, manifests, err := releaseutil.SortManifests(files, nil, releaseutil.InstallOrder)
	if err != nil {
		return nil, err
	}
	for _, m := range manifests {
		out.Manifests = append(out.Manifests, manifest{Source: m.Name, Content: m.Content})
	}
	for _, h := range hooks {
		events := []string{}
		for _, ev := range h.Events {
			events = append(events, string(ev))
		}
		out.Hooks = append(out.Hooks, hook{Source: h.Path, Kind: h.Kind, Name: h.Name, Events: events, Weight: h.Weight, Content: h.Manifest})
	}
	for _, crd := range chrt.CRDObjects() {
		out.CRDs = append(out.CRDs, manifest{Source: crd.Filename, Content: string(crd.File.Data)})
	}
	return out, nil
}

func main() {
	// Helm says through the log package when it drops a value while merging ours into the chart's
	// ("cannot overwrite table with non table", "Ignoring non-table value"): kept as warnings
	var logged bytes.Buffer
	log.SetFlags(0)
	log.SetOutput(&logged)
	var req request
	if err := json.NewDecoder(os.Stdin).Decode(&req); err != nil {
		fmt.Fprintf(os.Stderr, "helm-template: reading the request: %v\n", err)
		os.Exit(1)
	}
	out, err := render(req)
	if err == nil {
		seen := map[string]bool{}
		out.Warnings = []string{}
		for _, line := range strings.Split(logged.String(), "\n") {
			if line = strings.TrimSpace(line); line != "" && !seen[line] {
				seen[line] = true
				out.Warnings = append(out.Warnings, line)
			}
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, strings.Join(strings.Fields(err.Error()), " "))
		os.Exit(1)
	}
	if err := json.NewEncoder(os.Stdout).Encode(out); err != nil {
		fmt.Fprintf(os.Stderr, "helm-template: writing the result: %v\n", err)
		os.Exit(1)
	}
}
