//go:build linux

package nfnl

// Values from the kernel's uapi headers linux/netfilter/nfnetlink.h and
// linux/netfilter/nf_tables.h. golang.org/x/sys/unix lacks several of them,
// so the package keeps its own copy of every number it sends or parses.

// Message types of the nf_tables subsystem (NFT_MSG_*).
const (
	msgNewTable    = 0
	msgGetTable    = 1
	msgDelTable    = 2
	msgNewChain    = 3
	msgGetChain    = 4
	msgDelChain    = 5
	msgNewRule     = 6
	msgGetRule     = 7
	msgDelRule     = 8
	msgNewSet      = 9
	msgGetSet      = 10
	msgDelSet      = 11
	msgNewSetElem  = 12
	msgGetSetElem  = 13
	msgDelSetElem  = 14
	msgNewGen      = 15
	msgGetGen      = 16
	subsysNFTables = 10
)

// Batch framing (nfnetlink).
const (
	msgBatchBegin = 0x10
	msgBatchEnd   = 0x11
	attrBatchGen  = 1 // NFNL_BATCH_GENID
)

// The nfnetlink header (struct nfgenmsg) that follows the netlink one.
const nfgenLen = 4

// Table attributes (NFTA_TABLE_*).
const (
	attrTableName   = 1
	attrTableFlags  = 2
	attrTableUse    = 3
	attrTableHandle = 4
	attrTableUData  = 6
)

// Chain attributes (NFTA_CHAIN_*) and hook attributes (NFTA_HOOK_*).
const (
	attrChainTable    = 1
	attrChainHandle   = 2
	attrChainName     = 3
	attrChainHook     = 4
	attrChainPolicy   = 5
	attrChainUse      = 6
	attrChainType     = 7
	attrChainFlags    = 10
	attrChainUData    = 12
	attrHookNum       = 1
	attrHookPriority  = 2
	attrHookDev       = 3
	chainFlagBase     = 0x1
	chainFlagHWOffl   = 0x2
	chainFlagBinding  = 0x4
	chainFlagsAllowed = chainFlagBase | chainFlagHWOffl
)

// Rule attributes (NFTA_RULE_*), rule compat attributes and expression
// list attributes.
const (
	attrRuleTable    = 1
	attrRuleChain    = 2
	attrRuleHandle   = 3
	attrRuleExprs    = 4
	attrRuleCompat   = 5
	attrRulePosition = 6
	attrRuleUData    = 7
	attrRuleID       = 9
	attrRulePosID    = 10
	attrCompatProto  = 1
	attrCompatFlags  = 2
	attrListElem     = 1
	attrExprName     = 1
	attrExprData     = 2
)

// Set attributes (NFTA_SET_*), set description attributes and set element
// attributes (NFTA_SET_ELEM_*).
const (
	attrSetTable      = 1
	attrSetName       = 2
	attrSetFlags      = 3
	attrSetKeyType    = 4
	attrSetKeyLen     = 5
	attrSetDataType   = 6
	attrSetDataLen    = 7
	attrSetPolicy     = 8
	attrSetDesc       = 9
	attrSetID         = 10
	attrSetTimeout    = 11
	attrSetGCInterval = 12
	attrSetUData      = 13
	attrSetHandle     = 16
	attrDescSize      = 1
	attrDescConcat    = 2
	attrFieldLen      = 1

	attrElemListTable = 1
	attrElemListSet   = 2
	attrElemListElems = 3
	attrElemKey       = 1
	attrElemData      = 2
	attrElemFlags     = 3
	attrElemTimeout   = 4
	attrElemExpire    = 5
	attrElemUData     = 6
	attrElemKeyEnd    = 10

	attrDataValue    = 1
	attrDataVerdict  = 2
	attrVerdictCode  = 1
	attrVerdictChain = 2
)

// Generation attributes (NFTA_GEN_*).
const (
	attrGenID      = 1
	attrGenPID     = 2
	attrGenProcess = 3
)
