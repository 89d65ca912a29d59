package faults

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/vrnic/vrnic/admin"
)

// maxScenarioBytes bounds a scenario file.
const maxScenarioBytes = 1 << 20

// LoadScenario reads a scenario file (vrnicd -faults FILE): YAML when its
// name ends in .yaml or .yml, JSON otherwise. See ParseScenario.
func LoadScenario(path string) (admin.FaultScenario, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return admin.FaultScenario{}, fmt.Errorf("%w: %v", ErrScenario, err)
	}
	ext := strings.ToLower(filepath.Ext(path))
	sc, err := ParseScenario(b, ext == ".yaml" || ext == ".yml")
	if err != nil {
		return sc, fmt.Errorf("%s: %w", path, err)
	}
	return sc, nil
}

// ParseScenario decodes a scenario, JSON or YAML, strictly: unknown
// fields, trailing data, bad values and bad rules are errors that say
// what is wrong. YAML is read as the JSON document it spells (the same
// field names), then decoded as JSON.
func ParseScenario(b []byte, isYAML bool) (admin.FaultScenario, error) {
	var sc admin.FaultScenario
	if len(b) > maxScenarioBytes {
		return sc, fmt.Errorf("%w: larger than %d bytes", ErrScenario, maxScenarioBytes)
	}
	if isYAML {
		var doc any
		dec := yaml.NewDecoder(bytes.NewReader(b))
		if err := dec.Decode(&doc); err != nil {
			return sc, fmt.Errorf("%w: YAML: %v", ErrScenario, err)
		}
		var extra any
		if err := dec.Decode(&extra); err == nil {
			return sc, fmt.Errorf("%w: YAML: more than one document", ErrScenario)
		}
		j, err := json.Marshal(doc)
		if err != nil {
			return sc, fmt.Errorf("%w: YAML: %v", ErrScenario, err)
		}
		b = j
	}
	if err := admin.StrictJSON(b, &sc); err != nil {
		return admin.FaultScenario{}, fmt.Errorf("%w: %v", ErrScenario, err)
	}
	if err := CheckRules(sc.Rules); err != nil {
		return admin.FaultScenario{}, err
	}
	return sc, nil
}

// CheckRules validates rules as the daemon would install them: each
// rule (admin.FaultRule.Validate, and the opcode names against the
// opcode table), at most admin.MaxFaultRules, no id twice.
func CheckRules(rules []admin.FaultRule) error {
	if len(rules) > admin.MaxFaultRules {
		return fmt.Errorf("%w: %d rules, at most %d", admin.ErrFaultRule, len(rules), admin.MaxFaultRules)
	}
	ids := map[uint32]bool{}
	for _, r := range rules {
		if r.ID != 0 && ids[r.ID] {
			return fmt.Errorf("%w: rule %d given twice", admin.ErrFaultRule, r.ID)
		}
		ids[r.ID] = true
		if _, err := compile(r, 0, 0); err != nil {
			return err
		}
	}
	return nil
}
