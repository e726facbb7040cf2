package config

import "github.com/ackgate/ackgate/gate"

// effectEvidence reads effect.evidence. A route that names a result id takes
// result_id by default; one that names none must write status_only, so that a
// bare 2xx never becomes the effect's evidence by omission.
func effectEvidence(e *effectSpec, errs *routeErrs) gate.EvidenceKind {
	named := e.ResultIDHeader != "" || e.ResultIDPointer != ""
	switch ev := gate.EvidenceKind(e.Evidence); ev {
	case "":
		if !named {
			errs.add("effect.evidence", "required when neither result_id_header nor result_id_pointer is set: write evidence: status_only to accept a bare 2xx as proof of the effect, or name where the result id is")
		}
		return gate.EvidenceResultID
	case gate.EvidenceResultID:
		if !named {
			errs.add("effect.evidence", "result_id needs result_id_header or result_id_pointer")
		}
		return ev
	case gate.EvidenceStatusOnly:
		if named {
			errs.add("effect.evidence", "status_only, but result_id_header or result_id_pointer names a result id; drop one or the other")
		}
		return ev
	default:
		errs.add("effect.evidence", "%q is not result_id or status_only", e.Evidence)
		return ev
	}
}
