package connector

// Declaration names, as the engine's connector interface spells them.
const (
	DeclSupportsAttentionDP           = "supports_attention_dp"
	DeclRequiresBlockAlignedReuse     = "requires_block_aligned_reuse"
	DeclDropsReuseMatchBackoff        = "drops_reuse_match_backoff"
	DeclReportsFailedLoads            = "reports_failed_loads"
	DeclSupportsSpeculativePrefill    = "supports_speculative_prefill"
	DeclRequiresCompletionReservation = "requires_completion_reservation"
	DeclSupportsAdmissionQuery        = "supports_admission_query"
)

// Declarations are what a connector promises the engine's manager. They travel as data (a map
// from name to value) so an engine can read them over the wire.
type Declarations struct {
	// SupportsAttentionDP: both halves run on every attention-DP owner with owner-local state
	// and shared (w1r0) keys.
	SupportsAttentionDP bool
	// RequiresBlockAlignedReuse: the engine must align local reuse matches to whole blocks when
	// a one-model draft backs them off (a role that loads).
	RequiresBlockAlignedReuse bool
	// DropsReuseMatchBackoff: the engine drops the draft backoff and takes local matches whole
	// (a role that loads, with local_reuse_backoff off).
	DropsReuseMatchBackoff bool
	// ReportsFailedLoads: a request whose pages went missing is handed back for a restart
	// through TakeFailedLoadRequests / TakeFailedAsyncLoadRequests and DropBoundSaves.
	ReportsFailedLoads bool
	// SupportsSpeculativePrefill: keys cover the draft's prompt lookahead, only computed blocks
	// are saved and whole pages of every layer group move.
	SupportsSpeculativePrefill bool
	// RequiresCompletionReservation: the engine must reserve each request's completion
	// headroom at admission, since prefix restores are placed after the batch is final.
	RequiresCompletionReservation bool
	// SupportsAdmissionQuery: a lookup may be asked at admission; a later one replaces it.
	SupportsAdmissionQuery bool
}

// Map returns the declarations as data, every name present with an explicit bool.
func (d Declarations) Map() map[string]any {
	return map[string]any{
		DeclSupportsAttentionDP:           d.SupportsAttentionDP,
		DeclRequiresBlockAlignedReuse:     d.RequiresBlockAlignedReuse,
		DeclDropsReuseMatchBackoff:        d.DropsReuseMatchBackoff,
		DeclReportsFailedLoads:            d.ReportsFailedLoads,
		DeclSupportsSpeculativePrefill:    d.SupportsSpeculativePrefill,
		DeclRequiresCompletionReservation: d.RequiresCompletionReservation,
		DeclSupportsAdmissionQuery:        d.SupportsAdmissionQuery,
	}
}

// ReadDeclarations applies the manager's rules to declarations received as data: only a value
// that is exactly the boolean true counts (a string "true", a 1 or a missing name is false), and
// the declarations of a connector whose role transfers nothing are ignored, except
// supports_attention_dp, which is what lets a capacity-only server run under attention DP.
func ReadDeclarations(raw map[string]any, role Role) Declarations {
	is := func(name string) bool {
		v, ok := raw[name].(bool)
		return ok && v
	}
	d := Declarations{SupportsAttentionDP: is(DeclSupportsAttentionDP)}
	if !role.Transfers() {
		return d
	}
	d.RequiresBlockAlignedReuse = is(DeclRequiresBlockAlignedReuse)
	d.DropsReuseMatchBackoff = is(DeclDropsReuseMatchBackoff)
	d.ReportsFailedLoads = is(DeclReportsFailedLoads)
	d.SupportsSpeculativePrefill = is(DeclSupportsSpeculativePrefill)
	d.RequiresCompletionReservation = is(DeclRequiresCompletionReservation)
	d.SupportsAdmissionQuery = is(DeclSupportsAdmissionQuery)
	return d
}

// declarations returns what this connector declares for its options, before the manager's
// rules. A role that reads the pool always requires block-aligned reuse and drops the backoff
// unless local_reuse_backoff is align; producer and capacity roles never offer and declare
// neither, keeping the engine's own reuse.
func declarations(o Options) Declarations {
	loads := o.Role.Loads()
	return Declarations{
		SupportsAttentionDP:           true,
		RequiresBlockAlignedReuse:     loads,
		DropsReuseMatchBackoff:        loads && o.LocalReuseBackoff != ReuseBackoffAlign,
		ReportsFailedLoads:            true,
		SupportsSpeculativePrefill:    true,
		RequiresCompletionReservation: true,
		SupportsAdmissionQuery:        true,
	}
}
