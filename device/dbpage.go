package device

import "github.com/vrnic/vrnic/doorbell"

// NewDoorbellPage creates a context's doorbell page and kick eventfd with
// package doorbell (a sealed memfd of VRNIC_DB_PAGE_SIZE bytes with the
// header initialised; records handed out zeroed). It is the
// DoorbellFactory vrnicd uses. The engine reaches the page of a QP's
// context with QP.Doorbells().(*doorbell.Page) to read the records and
// register the kick eventfd with its poller.
//
// fd ownership: the page owns its memfd and kick eventfd and closes them
// in Close; the control server passes them to the client with SCM_RIGHTS
// (the kernel installs duplicates in the client).
func NewDoorbellPage() (DoorbellPage, error) {
	p, err := doorbell.New()
	if err != nil {
		return nil, err
	}
	return p, nil
}

var _ DoorbellPage = (*doorbell.Page)(nil)
